"""The Discord connection: the client, its intents, logging in, and shutting its tasks down.

Invariants:
- ``login`` retries network trouble (``NETWORK_ERRORS``) forever with exponential backoff and
  jitter (discord.py does not retry login); each attempt gets a fresh client (a failed login
  leaves discord.py's HTTP session closed), handed to ``on_client`` before it logs in so that
  ``stop`` can always close the current one. A rejected token (``LoginFailure``) is raised.
- The error texts (``MISSING_TOKEN``, ``BAD_TOKEN``, ``NO_INTENT``) say what to do, and that
  other transports keep running.
- ``settle_event_tasks``: discord.py runs each event handler in a task of its own ("discord.py:
  on_..."); those the last gateway events scheduled are given a moment, then cancelled and
  awaited, so none outlives the transport (a loop closed with one never started warns
  "coroutine ... was never awaited"). discord.py's wait for guilds before ``on_ready`` (a task
  of its connection state) is cancelled before the client closes (``cancel_ready_wait``): when
  it ended after the close it dispatched on a client without a loop, and its handler's
  coroutine was never awaited.
- Nothing the client sends can ping anyone (``NO_MENTIONS``); no voice, no voice warnings.
- ``cannot_work`` sorts what ends a connection: a refused token (login 401, or the gateway
  closing with 4004 when the token is revoked while the bot runs), the Message Content intent
  not enabled (4014) and other configuration refusals (4010-4013) cannot be fixed by trying
  again: the transport stays stopped and says why. Anything else is transient and the
  transport restarts with backoff.
- ``Link`` is what ``health()`` reports: the state, why, and a problem with its fix whenever
  people on Discord are not served (stopped, restarting) or lose messages (channel messages
  arriving without text: the Message Content intent is off).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import discord

from bot.config import DiscordConfig
from bot.transports.discord_policy import retry_delay
from bot.transports.discord_send import NETWORK_ERRORS, NO_MENTIONS, describe

log = logging.getLogger("bot.transport.discord")

# How long stop() lets discord.py's last event handlers finish before cancelling them.
EVENT_SETTLE_SECONDS = 2.0
STOP_TIMEOUT = 10.0

PORTAL = "https://discord.com/developers/applications"
MISSING_TOKEN = (
    "discord transport not started: the environment variable {env} is empty or not set. "
    "Fix: copy the bot token from " + PORTAL + " (your application -> Bot -> Reset Token) into "
    "{env}, or set 'discord: enabled: false'. Other transports keep running."
)
BAD_TOKEN = (
    "discord transport stopped: Discord rejected the token in {env} (401 Unauthorized). "
    "Fix: reset the token at " + PORTAL + " (your application -> Bot -> Reset Token), put the "
    "new one in {env} and restart. Other transports keep running."
)
NO_INTENT = (
    "discord transport stopped: the Message Content intent is not enabled for this bot "
    "(gateway close 4014). Fix: at " + PORTAL + " open your application -> Bot -> Privileged "
    "Gateway Intents, switch on MESSAGE CONTENT INTENT, save and restart; or set "
    "'discord: message_content_intent: false' (then replies to the bot must @mention it). "
    "Other transports keep running."
)

BAD_CONFIG = (
    "discord transport stopped: Discord refused the gateway connection ({why}). Fix: check "
    "the discord settings and the application at " + PORTAL + ", then restart. Other "
    "transports keep running."
)
NO_CONTENT = (
    "{n} channel message(s) arrived without text: the Message Content intent is off, so "
    "messages that do not @mention the bot (relayed chatter) are lost. Fix: at " + PORTAL + " "
    "open your application -> Bot -> Privileged Gateway Intents, switch on MESSAGE CONTENT "
    "INTENT, set 'discord: message_content_intent: true' and restart"
)
# Gateway close codes that no retry can fix (Discord's docs: "do not reconnect").
CONFIG_CLOSE = {4010: "invalid shard", 4011: "sharding required", 4012: "invalid API version",
                4013: "invalid intents"}  # fmt: skip


def cannot_work(exc: BaseException, *, env: str) -> str | None:
    """The ERROR text when ``exc`` means the transport cannot work until someone fixes
    something (it stays stopped); None when trying again may help."""
    if isinstance(exc, discord.LoginFailure):
        return BAD_TOKEN.format(env=env)
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return NO_INTENT
    if isinstance(exc, discord.ConnectionClosed):
        if exc.code == 4004:  # the token was revoked or reset while the bot ran
            return BAD_TOKEN.format(env=env)
        if exc.code in CONFIG_CLOSE:
            return BAD_CONFIG.format(why=f"close {exc.code}, {CONFIG_CLOSE[exc.code]}")
    if isinstance(exc, discord.HTTPException) and exc.status == 401:
        return BAD_TOKEN.format(env=env)
    return None


class Link:
    """The connection state ``DiscordTransport.health`` reports (no I/O, no discord calls)."""

    def __init__(self) -> None:
        self.state = "connecting"  # connecting, up, down, restarting, stopped
        self.detail = ""
        self.problem = ""
        self.contentless = 0  # guild messages for others that arrived without text

    def up(self) -> None:
        self.state, self.detail, self.problem = "up", "", ""

    def down(self) -> None:
        if self.state == "up":
            self.state, self.detail = "down", "gateway lost; discord.py reconnects"

    def restarting(self, why: str, delay: float, attempt: int) -> None:
        self.state = "restarting"
        self.detail = f"{why}; restart {attempt} in {delay:.0f} s"
        self.problem = (
            f"stopped after an unexpected error ({why}); restarting with backoff (attempt "
            f"{attempt}). If it keeps failing, see the log and report it"
        )

    def stopped(self, why: str) -> None:
        self.state, self.detail, self.problem = "stopped", why.split(":", 1)[-1].strip(), why

    def no_content(self) -> str | None:
        """Count a message that came without text; the warning text the first time."""
        self.contentless += 1
        return NO_CONTENT.format(n=1) if self.contentless == 1 else None

    def content_problem(self) -> str:
        return NO_CONTENT.format(n=self.contentless) if self.contentless else ""


ClientFactory = Callable[[discord.Intents], discord.Client]
# discord.py waits this long after the last GUILD_CREATE before ``on_ready`` (its default).
GUILD_READY_TIMEOUT = 2.0
Sleep = Callable[[float], Awaitable[None]]


def default_client(
    intents: discord.Intents, *, guild_ready_timeout: float = GUILD_READY_TIMEOUT
) -> discord.Client:
    """``guild_ready_timeout``: discord.py's own default (tests against the loopback Discord,
    which sends every guild in READY, pass a shorter one)."""
    # meshsage uses no voice: silence discord.py's one-time "PyNaCl/davey not installed"
    # warnings, which would only send operators looking for a problem they do not have.
    discord.VoiceClient.warn_nacl = False
    discord.VoiceClient.warn_dave = False
    return discord.Client(
        intents=intents, allowed_mentions=NO_MENTIONS, guild_ready_timeout=guild_ready_timeout
    )


def intents_for(config: DiscordConfig) -> discord.Intents:
    """Default intents (guilds, messages, DMs) plus message content when configured. Members
    and presences stay off: a guild message carries its author's roles without them."""
    intents = discord.Intents.default()
    intents.message_content = config.message_content_intent
    return intents


async def login(
    token: str,
    *,
    config: DiscordConfig,
    factory: ClientFactory,
    on_client: Callable[[discord.Client], None],
    sleep: Sleep,
    rand: Callable[[], float],
) -> discord.Client:
    """Log in, retrying network trouble with backoff; returns the logged-in client."""
    attempt = 0
    while True:
        client = factory(intents_for(config))
        on_client(client)
        try:
            await asyncio.wait_for(client.login(token), timeout=config.login_timeout)
            return client
        except NETWORK_ERRORS as exc:
            await client.close()
            delay = retry_delay(
                attempt, initial=config.retry_initial, cap=config.retry_max, rand=rand()
            )
            log.warning(
                "cannot reach Discord to log in (%s); retrying in %.0f s", describe(exc), delay
            )
            await sleep(delay)
            attempt += 1


def cancel_ready_wait(client: discord.Client) -> None:
    """Cancel discord.py's pending wait for guilds (it would dispatch ``on_ready`` after the
    client closed). discord.py keeps that task on its connection state; absent, nothing."""
    task = getattr(getattr(client, "_connection", None), "_ready_task", None)
    if isinstance(task, asyncio.Task) and not task.done():
        task.cancel()


async def settle_event_tasks() -> None:
    """Let discord.py's last event-handler tasks finish, then cancel and await the rest."""
    me = asyncio.current_task()
    pending = {
        t
        for t in asyncio.all_tasks()
        if t is not me and not t.done() and t.get_name().startswith("discord.py: ")
    }
    if not pending:
        return
    _, late = await asyncio.wait(pending, timeout=EVENT_SETTLE_SECONDS)
    for t in late:
        t.cancel()
    if late:
        await asyncio.wait(late, timeout=EVENT_SETTLE_SECONDS)
