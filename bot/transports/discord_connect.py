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

ClientFactory = Callable[[discord.Intents], discord.Client]
Sleep = Callable[[float], Awaitable[None]]


def default_client(intents: discord.Intents) -> discord.Client:
    # meshsage uses no voice: silence discord.py's one-time "PyNaCl/davey not installed"
    # warnings, which would only send operators looking for a problem they do not have.
    discord.VoiceClient.warn_nacl = False
    discord.VoiceClient.warn_dave = False
    return discord.Client(intents=intents, allowed_mentions=NO_MENTIONS)


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
