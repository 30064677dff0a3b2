"""Discord transport on discord.py 2.x: DMs and @mentions in allowed channels in, replies out.
Only ``bot/transports/discord*.py`` import discord: this module owns the connection and the
sending side, composes the inbound side (``discord_events.DiscordEvents``, which owns its
state) and the flow between the parts, which do one job each: ``discord_connect`` (client, login,
shutdown of its tasks), ``discord_inbound`` (which messages are answered, as what
``Inbound``), ``discord_read`` (message -> text), ``discord_send`` (posts and files),
``discord_stream`` (streamed answers), ``discord_resume`` (finishing what an interrupted
answer left on screen), ``discord_catchup`` (missed messages) and ``discord_relay`` (the
bridge's Discord side); text fitting, attachments and admission rules are pure
(``discord_text``, ``discord_attach``, ``discord_policy``).

Invariants:
- Inbound: who is answered is decided by ``discord_policy.admit`` (bots and webhooks never; DMs
  when enabled; in guilds only listed channels, and only when the bot is @mentioned or a reply
  to one of its messages). The mention is stripped. sender = the author's id; space =
  ``DM_SPACE`` for DMs, else ``guild:<guild id>:ch:<channel id>`` (one conversation per person
  per channel, so nothing said in a DM reaches a channel reply). Each message id is handed on
  at most once. In a shared channel (threads too) the sender's name is ``Alice (id 930...)``,
  display name and stable id (``discord_text.speaker``), stored as the message's author and
  shown before each of the person's messages in the prompt (``names_speakers``); the prompt's
  earlier turns never change with a new display name. DMs are unchanged.
- Outbound: ``fit(text)`` is ``discord_text.fit_text`` (at most ``max_parts`` messages of at
  most 2,000 characters); ``send`` delivers exactly ``split_message(fit(text))``: the first
  part as a reply to the triggering message (no author ping), the rest as follow-ups, with
  ``Reply.note`` as one small subtext line (``-# ...``) that is not part of the stored answer.
  Nothing the bot sends can ping anyone (``AllowedMentions.none()``): an LLM answer saying
  "@everyone" stays text. Attachments marked ``dm_only`` (``!export``) go to the person by DM.
- Streaming (``discord.stream``, on by default): ``stream(inbound)`` gives the responder a
  ``DiscordStream``; the answer appears with its first words and grows by edits at most every
  ``stream_edit_seconds``; the typing indicator stops at the first post. Messages an
  interrupted stream left on screen (``Reply.shown``, or ``shown`` for a new stream) are
  edited into the answer, never followed by a second one (``discord_resume``).
- ``send`` never raises; trouble is reported in the ``Delivery``. ``working`` shows the typing
  indicator and never fails the turn.
- Startup: ``start`` never raises. A missing token, a rejected token (LoginFailure, or the
  gateway closing 4004 when the token is revoked while the bot runs) or the message-content
  intent not enabled (close 4014, PrivilegedIntentsRequired) end this transport with one ERROR
  line saying what to do (``discord_connect.cannot_work``); ``wait_closed`` then returns,
  ``health()`` says why, and other transports keep running (replies for Discord stay in the
  outbox). Network trouble at login is retried forever with exponential backoff and jitter
  (discord.py does not retry login); after login discord.py reconnects by itself; anything
  else that ends the connection (an unexpected exception inside discord.py's loop) restarts
  it with the same backoff, reported by ``health()`` until it is up again.
- Reply chains (guild channels): a message replying to another person's message, or to the
  bot's answer to someone else, carries that message as a quote (``(replying to Bob:)`` and
  ``> `` lines, at most ``QUOTE_MAX_CHARS``): it is visible in the channel, and it is stored in
  the asker's conversation only, as part of the asker's message. Nobody else's memory is read.
- Attachments: text files are read into the message (``discord_attach``), within
  ``max_message_chars``; images and other files are named, and the person's answer carries a
  one-line note saying what was not read.
- Files: each upload message stays within ``upload_limit`` (compressed or split when needed,
  with a note); if files cannot be sent after the text said they were coming, a follow-up
  says so plainly.
- Catch-up (``discord_catchup``): every new gateway session (start, or a reconnect that could
  not resume) reads DMs and allowed channels back to the last message handled there (bounded
  by ``catch_up``) and hands on, through the same admission path, what is not stored yet.
- Edits (``on_raw_message_edit``): an edit whose text changed is handed on as
  ``Inbound.edited`` with the message's id, admitted like a new message, except that one that
  no longer addresses the bot (mention removed) still goes on as ``edit_only`` (stored text
  follows, never answered). An answer that follows an edit carries the note "answer to your
  edited message".
- Threads (``follow_threads``): a thread where the bot was @mentioned (in an allowed channel)
  is followed (``SeenMarks.followed``): its messages are answered without a mention until
  ``!stop`` there, the thread is archived or deleted, or ``thread_idle`` seconds of silence.
  Catch-up reads followed threads too; a DM channel seen for the first time is read back
  before its message (what was said there while the bot was away).
- Message text is never logged above DEBUG.
- Commands arrive as ordinary messages (``!reset``, after the @mention in a channel) and, with
  ``slash_commands`` (on by default), as slash commands (``discord_slash``): the same command
  as its ``!`` form, answered through the interaction (ephemeral in a shared channel where
  the answer is private), never into the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path

import aiohttp
import discord

from bot.config import DiscordConfig, RelayConfig
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply, TransportLimits
from bot.transports.base import OnMessage, ShownRecord, TransportHealth
from bot.transports.discord_attach import merge_notes
from bot.transports.discord_catchup import Known, SeenMarks
from bot.transports.discord_connect import (
    MISSING_TOKEN,
    STOP_TIMEOUT,
    ClientFactory,
    Link,
    Sleep,
    cancel_ready_wait,
    cannot_work,
    default_client,
    login,
    settle_event_tasks,
)
from bot.transports.discord_events import EDITED_NOTE, DiscordEvents, Recent
from bot.transports.discord_inbound import NAME, OwnMessages
from bot.transports.discord_policy import retry_delay
from bot.transports.discord_read import read_attachments
from bot.transports.discord_relay import DiscordRelay
from bot.transports.discord_resume import Earlier
from bot.transports.discord_send import (
    NO_MENTIONS,
    Target,
    describe,
    marked_nonces,
    part_nonce,
    post,
    reply_target,
    send_attachments,
    transient,
)
from bot.transports.discord_slash import SLASH_NAMES, SlashCommands
from bot.transports.discord_stream import DiscordStream
from bot.transports.discord_text import (
    DISCORD_MAX_CHARS,
    fit_text,
    note_line,
    split_message,
    units,
)
from bot.transports.discord_threads import Threads

__all__ = [
    "EDITED_NOTE",
    "NAME",
    "NO_MENTIONS",
    "STYLE_HINT",
    "DiscordTransport",
    "build_discord",
]

log = logging.getLogger("bot.transport.discord")

STYLE_HINT = (
    "You are answering on Discord: be concise, use Discord Markdown, and put code in fenced "
    "code blocks."
)
REREAD_WAIT = 60.0  # seconds a question stored before a restart waits for the gateway
IMAGES_LOST = "your image could not be looked at again after a restart; send it again"
SEND_ERRORS: tuple[type[BaseException], ...] = (
    discord.HTTPException,
    discord.ClientException,
    OSError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
)
# ValueError: an inbound whose ids are not Discord's (send never raises).
DELIVERY_ERRORS: tuple[type[BaseException], ...] = (*SEND_ERRORS, ValueError)


class DiscordTransport:
    """The Discord transport (see the module docstring); its inbound side is ``DiscordEvents``."""

    name = NAME

    def __init__(
        self,
        *,
        config: DiscordConfig,
        token: str | None,
        client_factory: ClientFactory = default_client,
        sleep: Sleep = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        max_message_chars: int = 4000,
        seen_path: Path | None = None,
        known: Known | None = None,
        clock: Callable[[], float] = time.monotonic,
        vision: bool = False,
        command_prefix: str = "!",
        command_names: tuple[str, ...] = SLASH_NAMES,
    ) -> None:
        self.limits = TransportLimits(
            context_tokens=config.context_tokens,
            max_tokens=config.max_tokens,
            style_hint=STYLE_HINT,
            names_speakers=True,
        )
        self._config = config
        self._max_message_chars = max_message_chars
        self._typing: dict[str, discord.context_managers.Typing] = {}
        self._token = token
        self._client_factory = client_factory
        self._sleep = sleep
        self._rand = rand
        self._clock = clock
        self._vision = vision
        self._client: discord.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._recent = Recent(limit=config.remembered_messages)  # shared with the events
        self._mine = OwnMessages(limit=config.remembered_messages)  # the bot's own messages
        self._link = Link()  # what health() reports
        self._stopping = False
        self._restarts = 0  # unexpected failures since the last ready
        self.slash = (
            SlashCommands(
                config=config,
                prefix=command_prefix,
                names=command_names,
                handle=lambda: self._events.on_message,
                transport=NAME,
            )
            if config.slash_commands
            else None
        )
        marks = SeenMarks(seen_path)
        self._events = DiscordEvents(
            config=config,
            max_message_chars=max_message_chars,
            vision=vision,
            link=self._link,
            marks=marks,
            known=known,
            mine=self._mine,
            threads=Threads(config=config, marks=marks, prefix=command_prefix),
            slash=self.slash,
            recent=self._recent,
            on_ready=self._ready,
        )

    @property
    def caught_up(self) -> asyncio.Event:
        """Set when the latest session's catch-up is done."""
        return self._events.caught_up

    @property
    def relay(self) -> DiscordRelay | None:
        """The bridge's Discord side, when ``relay:`` is set (``attach_relay``)."""
        return self._events.relay

    def _ready(self) -> None:
        self._restarts = 0

    # --- port -------------------------------------------------------------------------------
    def fit(self, text: str) -> str:
        return fit_text(text, limit=DISCORD_MAX_CHARS, max_parts=self._config.max_parts)

    async def start(self, on_message: OnMessage) -> None:
        if not self._token:
            log.error(MISSING_TOKEN.format(env=self._config.token_env))
            self._link.stopped(MISSING_TOKEN.format(env=self._config.token_env))
            self._closed.set()
            return
        self._events.start(on_message)
        self._task = asyncio.create_task(self._run(self._token), name="discord")

    @contextlib.asynccontextmanager
    async def working(self, inbound: Inbound) -> AsyncIterator[None]:
        message = self._recent.message(inbound.message_id)
        if message is None or self._client is None or self._client.is_closed():
            yield
            return
        typing = message.channel.typing()
        entered = True
        try:
            await typing.__aenter__()
        except SEND_ERRORS as exc:  # no typing indicator is no reason to fail the answer
            log.debug("typing indicator failed in %s: %s", inbound.space, describe(exc))
            entered = False
        if entered:
            self._typing[inbound.message_id or ""] = typing
        try:
            yield
        finally:
            self._typing.pop(inbound.message_id or "", None)
            if entered:
                await typing.__aexit__(None, None, None)

    async def send(self, reply: Reply) -> Delivery:
        client = self._client
        if client is None or client.is_closed():
            # the durable outbox keeps it and sends it once the gateway is back
            return Delivery(DeliveryStatus.PENDING, detail="discord is not connected")
        parts = split_message(self.fit(reply.text))
        note = self._note_for(reply)
        if note is not None:
            if parts and units(parts[-1] + "\n" + note) <= DISCORD_MAX_CHARS:
                parts[-1] += "\n" + note
            else:
                parts.append(note)
        if not parts and not reply.attachments:
            return Delivery(DeliveryStatus.FAILED, detail="nothing to send (empty reply)")
        if self.slash is not None and self.slash.owns(reply.inbound):
            return await self.slash.send(client, reply, parts, limit=self._config.upload_limit)
        sent: list[str] = []
        # Messages an interrupted stream of this answer left on screen: edited into the parts
        # (a restart finishes the half answer instead of posting a second one under it).
        earlier = Earlier(tuple(s for s in reply.shown if s[0] not in reply.done_parts))
        try:
            if parts:
                channel, reference = await self._target(client, reply.inbound)
                # a post repeated after a 5xx-after-write returns its first message (nonce)
                nonces = marked_nonces(reply.shown)
                for i, part in enumerate(parts):
                    if i in reply.done_parts:  # posted before a restart: never twice
                        continue
                    nonce = nonces.get(i) or (  # no row (a notice): discord.py's random one
                        None
                        if reply.outbox_id is None
                        else part_nonce(f"o{reply.outbox_id}:{part}", i)
                    )
                    msg = await earlier.take(channel, part) or await post(
                        channel, part, reference if i == 0 else None, nonce
                    )
                    sent.append(str(msg.id))
                    if reply.progress is not None:
                        await reply.progress(i, str(msg.id))
                    self._mine.remember(msg.id, head=int(sent[0]))
                    if i == 0:
                        self._mine.answered(msg.id, reply.inbound.sender)
                await earlier.drop(channel)
            if reply.attachments:
                recent = self._recent.message(reply.inbound.message_id)
                for msg in await send_attachments(
                    client, reply, recent, limit=self._config.upload_limit
                ):
                    sent.append(str(msg.id))
                    self._mine.remember(msg.id)
        except DELIVERY_ERRORS as exc:
            # Discord unreachable (network, 5xx) or rate limiting (429 without Via): the
            # outbox keeps the row and the parts not yet posted go out on a later try;
            # Discord refusing (403, 404, 400) is final.
            retry = transient(exc)
            why = cannot_work(exc, env=self._config.token_env)
            if why is not None:  # token revoked meanwhile: the reply waits in the outbox
                retry = True
                if self._link.state != "stopped":
                    log.error(why)
                self._link.stopped(why)
            log.warning(
                "delivery to %s %s after %d message(s): %s",
                reply.inbound.key,
                "postponed" if retry else "failed",
                len(sent),
                describe(exc),
            )
            status = DeliveryStatus.PENDING if retry else DeliveryStatus.FAILED
            return Delivery(status, tuple(sent), detail=describe(exc))
        return Delivery(DeliveryStatus.DELIVERED, tuple(sent))

    def stream(
        self,
        inbound: Inbound,
        *,
        shown: tuple[tuple[int, str], ...] = (),
        record: ShownRecord | None = None,
    ) -> DiscordStream | None:
        """A streamed answer to ``inbound`` (None when streaming is off or Discord is down);
        ``shown``: messages an interrupted stream of it left, reused in order."""
        client = self._client
        if not self._config.stream or client is None or client.is_closed():
            return None
        if self.slash is not None and self.slash.owns(inbound):
            return None  # a slash command's answer goes through its interaction

        def on_post(message: discord.Message, head: int) -> None:
            self._mine.remember(message.id, head=head)
            if message.id == head:
                self._mine.answered(head, inbound.sender)

        stream = DiscordStream(
            target=lambda: self._target(client, inbound),
            max_parts=self._config.max_parts,
            interval=self._config.stream_edit_seconds,
            clock=self._clock,
            sleep=self._sleep,
            on_post=on_post,
            note=self._note_for,
            earlier=Earlier(shown, record),
            record=record,
            nonces=marked_nonces(shown),
        )
        stream.first_post = lambda: self._stop_typing(inbound)
        return stream

    def awaits_answer(self, inbound: Inbound) -> bool:
        """A slash command shows "thinking..." until answered: it gets every notice."""
        return self.slash is not None and self.slash.owns(inbound)

    async def reread(self, inbound: Inbound) -> Inbound:
        """A question stored before a restart, with its images read again (they are never
        stored); when they cannot be, its answer says so. Never raises."""
        if not self._vision or "[image: " not in inbound.text or not inbound.message_id:
            return inbound
        try:
            # at start the pending questions are queued before the gateway is up
            await asyncio.wait_for(self.caught_up.wait(), REREAD_WAIT)
            client = self._client
            if client is None or client.is_closed():
                raise discord.ClientException("Discord is not connected")
            channel, _ = await reply_target(client, replace(inbound, message_id=None), None)
            message = await channel.fetch_message(int(inbound.message_id))
            _, note, images = await read_attachments(
                message, "", budget=self._max_message_chars, vision=True
            )
        except DELIVERY_ERRORS as exc:
            log.warning("could not read the images of %s again after the restart: %s",
                        inbound.key, describe(exc))  # fmt: skip
            self._recent.note(inbound.message_id, IMAGES_LOST)
            return inbound
        if note is not None:
            self._recent.note(inbound.message_id, note)
        return replace(inbound, images=images)

    def attach_relay(self, config: RelayConfig) -> DiscordRelay:
        """The bridge's Discord side, fed by this transport's messages."""
        relay = DiscordRelay(
            client=lambda: self._client,
            channels=frozenset(p.discord_channel for p in config.pairs),
            webhook=config.webhook,
        )
        self._events.feed(relay)
        return relay

    async def _target(self, client: discord.Client, inbound: Inbound) -> Target:
        thread = self._recent.thread(inbound.message_id)
        if thread is not None:  # open_threads: the answer opens the conversation there
            return thread, None
        return await reply_target(client, inbound, self._recent.message(inbound.message_id))

    def _note_for(self, reply: Reply) -> str | None:
        pending = self._recent.pop_note(reply.inbound.message_id)
        return note_line(merge_notes(reply.note, pending))

    def _stop_typing(self, inbound: Inbound) -> None:
        typing = self._typing.pop(inbound.message_id or "", None)
        if typing is not None and typing.task is not None:
            typing.task.cancel()  # the answer is visible: no "is typing..." under it

    def health(self) -> TransportHealth:
        link = self._link
        problem = link.problem or link.content_problem()
        detail = link.detail or (f"{link.contentless} message(s) without text" if
                                 link.contentless else "")  # fmt: skip
        return TransportHealth(link=link.state, detail=detail, problem=problem)

    async def stop(self) -> None:
        self._stopping = True
        client, task = self._client, self._task
        await self._events.stop()  # a catch-up in progress
        if client is not None:
            cancel_ready_wait(client)
            with contextlib.suppress(*SEND_ERRORS):
                await asyncio.wait_for(client.close(), timeout=STOP_TIMEOUT)
        if task is not None and not task.done():
            task.cancel()  # a login attempt or backoff sleep in progress
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # discord.py's last event-handler tasks are owned here (discord_connect)
        await settle_event_tasks()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- connection -------------------------------------------------------------------------
    async def _run(self, token: str) -> None:
        env = self._config.token_env
        try:
            while not self._stopping:
                try:
                    client = await self._login(token)
                    await client.connect(reconnect=True)
                    if self._stopping:
                        return
                    raise ConnectionError("the gateway connection ended")
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # task boundary: Discord must not end other transports
                    why = cannot_work(exc, env=env)
                    if why is not None:  # a retry cannot help: stay stopped, say why
                        log.error(why)
                        self._link.stopped(why)
                        return
                    if self._stopping:
                        return
                    await self._close_client()
                    delay = retry_delay(
                        self._restarts,
                        initial=self._config.retry_initial,
                        cap=self._config.retry_max,
                        rand=self._rand(),
                    )
                    self._restarts += 1
                    log.exception(
                        "discord transport stopped unexpectedly (%s); restarting in %.0f s "
                        "(attempt %d); other transports keep running",
                        describe(exc),
                        delay,
                        self._restarts,
                    )
                    self._link.restarting(describe(exc), delay, self._restarts)
                    await self._sleep(delay)
        finally:
            await self._close_client()
            self._closed.set()

    async def _close_client(self) -> None:
        if self._client is not None:
            cancel_ready_wait(self._client)
            with contextlib.suppress(Exception):
                await self._client.close()

    async def _login(self, token: str) -> discord.Client:
        def current(client: discord.Client) -> None:
            self._events.register(client)
            self._client = client

        return await login(
            token,
            config=self._config,
            factory=self._client_factory,
            on_client=current,
            sleep=self._sleep,
            rand=self._rand,
        )


def build_discord(
    config: DiscordConfig,
    *,
    env: Mapping[str, str],
    client_factory: ClientFactory | None = None,
    sleep: Sleep | None = None,
    rand: Callable[[], float] | None = None,
    max_message_chars: int = 4000,
    seen_path: Path | None = None,
    known: Known | None = None,
    clock: Callable[[], float] | None = None,
    vision: bool = False,
    command_prefix: str = "!",
    command_names: tuple[str, ...] | None = None,
) -> DiscordTransport:
    """The Discord transport with its token read from ``env[config.token_env]``."""
    token = (env.get(config.token_env) or "").strip() or None
    return DiscordTransport(
        config=config,
        token=token,
        client_factory=client_factory or default_client,
        sleep=sleep or asyncio.sleep,
        rand=rand or random.random,
        max_message_chars=max_message_chars,
        seen_path=seen_path,
        known=known,
        clock=clock or time.monotonic,
        vision=vision,
        command_prefix=command_prefix,
        command_names=command_names or SLASH_NAMES,
    )
