"""The Discord transport's inbound events (``bot.transports.discord`` composes them): the
handlers registered on each client (ready, message, edit, reaction), catch-up after a new
session, and the path every message takes to the responder. ``DiscordEvents`` owns the
inbound state (the catch-up task, ``caught_up``, the slash command tree, the handler, the
relay's feed); ``Recent`` holds what the transport remembers of the messages it handed on
(the message, a note for its answer, the thread opened for it), shared with the sending side.

Invariants: the module docstring of ``bot.transports.discord`` (inbound, catch-up, edits,
threads); one bad message never stops the next (each handler is an event boundary); ``Recent``
keeps at most ``remembered_messages`` of each kind, the oldest dropped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

import discord

from bot.config import DiscordConfig
from bot.domain import Inbound
from bot.transports.base import OnMessage
from bot.transports.discord_catchup import MAX_DM_CHANNELS, Known, SeenMarks, catch_up, read_back
from bot.transports.discord_connect import Link
from bot.transports.discord_inbound import OwnMessages, to_inbound
from bot.transports.discord_read import is_dm as dm_channel
from bot.transports.discord_read import read_attachments, readable_text
from bot.transports.discord_relay import DiscordRelay
from bot.transports.discord_send import channel_space
from bot.transports.discord_slash import SlashCommands
from bot.transports.discord_threads import Threads

log = logging.getLogger("bot.transport.discord")

EDITED_NOTE = "answer to your edited message"


class Recent:
    """The messages handed on lately (see the module docstring), by message id."""

    def __init__(self, *, limit: int) -> None:
        self._limit = limit
        # inbound message id -> the discord Message, so a reply can reference and type in it
        self.messages: OrderedDict[str, discord.Message] = OrderedDict()
        # inbound message id -> a note for its answer (attachments not read, text cut)
        self._notes: OrderedDict[str, str] = OrderedDict()
        self._opened: dict[str, discord.Thread] = {}  # question id -> the thread opened for it

    def remember(self, message_id: str, message: discord.Message) -> None:
        self.messages[message_id] = message
        while len(self.messages) > self._limit:
            self.messages.popitem(last=False)

    def message(self, message_id: str | None) -> discord.Message | None:
        return self.messages.get(message_id or "")

    def note(self, message_id: str, text: str) -> None:
        """``text`` goes with the answer to ``message_id``, as its note line."""
        self._notes[message_id] = text
        while len(self._notes) > self._limit:
            self._notes.popitem(last=False)

    def pop_note(self, message_id: str | None) -> str | None:
        return self._notes.pop(message_id or "", None)

    def opened(self, message_id: str, thread: discord.Thread) -> None:
        """The answer to ``message_id`` goes into ``thread`` (opened for it)."""
        self._opened[message_id] = thread
        while len(self._opened) > self._limit:
            self._opened.pop(next(iter(self._opened)))

    def thread(self, message_id: str | None) -> discord.Thread | None:
        return self._opened.get(message_id or "")


class DiscordEvents:
    """The inbound side of ``DiscordTransport`` (see the module docstring)."""

    def __init__(
        self,
        *,
        config: DiscordConfig,
        max_message_chars: int,
        vision: bool,
        link: Link,
        marks: SeenMarks,
        known: Known | None,
        mine: OwnMessages,
        threads: Threads,
        slash: SlashCommands | None,
        recent: Recent,
        on_ready: Callable[[], None],
    ) -> None:
        self._config = config
        self._max_message_chars = max_message_chars
        self._vision = vision
        self._link = link
        self._marks = marks
        self._known = known
        self._mine = mine
        self._threads = threads
        self._slash = slash
        self._recent = recent
        self._on_ready = on_ready  # a session is up (the transport's restart count starts over)
        self._on_message: OnMessage | None = None
        self._catchup_task: asyncio.Task[None] | None = None
        self.caught_up = asyncio.Event()  # set when the latest session's catch-up is done
        self._tree: discord.app_commands.CommandTree[discord.Client] | None = None
        self.relay: DiscordRelay | None = None  # the bridge's Discord side, when relay: is set

    @property
    def on_message(self) -> OnMessage | None:
        """Where messages go (the responder), once ``start`` gave it."""
        return self._on_message

    def start(self, on_message: OnMessage) -> None:
        self._on_message = on_message

    def feed(self, relay: DiscordRelay) -> None:
        """Live messages of the relay's channels (and reactions) go to ``relay`` too."""
        self.relay = relay

    async def stop(self) -> None:
        """Cancel a catch-up in progress and wait for it to end."""
        if self._catchup_task is not None and not self._catchup_task.done():
            self._catchup_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._catchup_task

    def register(self, client: discord.Client) -> None:
        async def on_ready() -> None:
            me = client.user
            log.info(
                "connected to Discord as %s (id %s); DMs %s; %d channel(s) allowed",
                me,
                me.id if me else "?",
                "on" if self._config.dms else "off",
                len(self._config.channels),
            )

            self._link.up()
            self._on_ready()
            # A new session (start, or a reconnect Discord could not resume): what was said
            # meanwhile is read from history. A resumed session replays events by itself.
            if self._catchup_task is not None and not self._catchup_task.done():
                self._catchup_task.cancel()
            self.caught_up.clear()
            self._catchup_task = asyncio.create_task(self._catch_up(client), name="catch-up")
            if self._slash is not None and self._tree is not None:
                await self._slash.sync(self._tree)

        async def on_message(message: discord.Message) -> None:
            await self._handle(client, message)

        self._threads.register(client)

        async def on_raw_message_edit(payload: discord.RawMessageUpdateEvent) -> None:
            await self._edited(client, payload.message, payload.cached_message)

        async def on_raw_reaction_add(event: discord.RawReactionActionEvent) -> None:
            relay = self.relay
            if relay is not None and client.user is not None:
                relay.offer_reaction(event, me=client.user.id)

        async def on_resumed() -> None:
            self._link.up()

        async def on_disconnect() -> None:
            self._link.down()

        client.event(on_ready)
        client.event(on_message)
        client.event(on_raw_message_edit)
        client.event(on_raw_reaction_add)
        client.event(on_resumed)
        client.event(on_disconnect)
        if self._slash is not None:
            self._tree = self._slash.install(client)

    # --- inbound ----------------------------------------------------------------------------
    async def _catch_up(self, client: discord.Client) -> None:
        # DM channels most recently active first, at most MAX_DM_CHANNELS (one request each)
        dms = sorted(self._marks.dms, key=lambda c: self._marks.last.get(c, 0), reverse=True)
        channels = [*self._config.channels, *dms[:MAX_DM_CHANNELS]]
        channels += [c.id for c in client.private_channels if c.id not in channels]
        channels += self._threads.ids()
        try:
            await catch_up(
                client,
                channel_ids=channels,
                marks=self._marks,
                config=self._config.catch_up,
                known=self._known,
                handle=lambda m: self._handle(client, m, live=False),
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # task boundary: live messages keep flowing without catch-up
            log.exception("Discord catch-up failed")
        self.caught_up.set()

    async def _handle(
        self, client: discord.Client, message: discord.Message, *, live: bool = True
    ) -> None:
        try:
            channel = message.channel
            if live and dm_channel(channel) and channel.id not in self._marks.dms:
                # A DM channel never seen: what its person said while we were away (their
                # first-ever DM, too) is read back and answered before this message.
                await read_back(
                    channel,
                    message,
                    config=self._config.catch_up,
                    known=self._known,
                    handle=lambda m: self._handle(client, m, live=False),
                )
            inbound = to_inbound(
                message,
                me=client.user,
                config=self._config,
                mine=self._mine,
                handled=self._recent.messages,
                followed=self._threads.followed(channel),
            )
            if inbound is not None and not await self._threads.admitted(message, inbound):
                return  # "!stop" in a followed thread
            if inbound is not None and message.guild is not None:
                opened = await self._threads.open_for(message, inbound)
                if opened is not None:  # the question and its answer belong to the new thread
                    self._recent.opened(str(message.id), opened)
                    space = channel_space(message.guild.id, opened.id)
                    inbound = replace(inbound, space=space)
            relay = self.relay
            if (
                live
                and relay is not None
                and client.user is not None
                and message.channel.id in relay.channels
            ):
                # Late history (catch-up) is not relayed: the mesh gets live chatter only.
                relay.offer(
                    message,
                    me=client.user.id,
                    # For the AI (answered here, or @mentioning it where it does not answer):
                    # never mirrored to the mesh as chatter.
                    addressed=inbound is not None
                    or any(u.id == client.user.id for u in message.mentions),
                    text=readable_text(message, message.content),
                )
            if inbound is None and live:
                self._check_content(client, message)
            if inbound is None or self._on_message is None:
                return
            self._recent.remember(str(message.id), message)
            if message.attachments:
                inbound = await self._with_attachments(message, inbound)
            await self._on_message(inbound)
        except Exception:  # event boundary: one bad message must not stop the next
            log.exception("handling Discord message %s failed", message.id)
        finally:
            channel = message.channel
            dm = dm_channel(channel)
            if dm or channel.id in self._config.channels or channel.id in self._marks.followed:
                self._marks.see(channel.id, message.id, dm=dm)

    def _check_content(self, client: discord.Client, message: discord.Message) -> None:
        """A guild message for others with no text at all, in a channel the bot reads: the
        Message Content intent is off (Discord sends such messages empty), so relayed chatter
        and replies without a mention are lost. Said once in the log, kept in ``health()``."""
        relay = self.relay
        watched = message.channel.id in self._config.channels or (
            relay is not None and message.channel.id in relay.channels
        )
        if (
            not watched
            or message.guild is None
            or message.author.bot
            or message.webhook_id is not None
            or message.content
            or message.attachments
            or message.embeds
            or message.stickers
            or message.poll is not None
            or (client.user is not None and any(u.id == client.user.id for u in message.mentions))
        ):
            return
        warning = self._link.no_content()
        if warning is not None:
            log.warning(warning)

    async def _edited(
        self, client: discord.Client, message: discord.Message, cached: discord.Message | None
    ) -> None:
        """A person edited a message: handed on as an edit (``Inbound.edited``) when its text
        changed; a link preview appearing (no ``edited_at``) is no edit."""
        try:
            before = cached or self._recent.message(str(message.id))
            if message.edited_at is None or (
                before is not None and before.content == message.content
            ):
                return
            inbound = to_inbound(
                message,
                me=client.user,
                config=self._config,
                mine=self._mine,
                handled=(),
                edit=True,
            )
            if inbound is None or self._on_message is None:
                return
            if not inbound.edit_only:
                self._recent.remember(str(message.id), message)
                self._recent.note(str(message.id), EDITED_NOTE)
            if message.attachments:
                inbound = await self._with_attachments(message, inbound)
            await self._on_message(inbound)
        except Exception:  # event boundary: one bad edit must not stop the next event
            log.exception("handling the edit of Discord message %s failed", message.id)

    async def _with_attachments(self, message: discord.Message, inbound: Inbound) -> Inbound:
        text, note, images = await read_attachments(
            message, inbound.text, budget=self._max_message_chars, vision=self._vision
        )
        if note is not None:  # goes with the answer, as its note line
            self._recent.note(str(message.id), note)
        return replace(inbound, text=text, images=images)
