"""The mesh <-> Discord bridge: a mesh channel mirrored to a Discord channel (``relay:``).

No platform import here: the Meshtastic and Discord transports hand over ``MeshText`` and
``DiscordText`` values and offer the small ``MeshSide``/``DiscordSide`` ports below.

Invariants:
- Nothing is relayed unless a pair lists it, and only in the pair's direction.
- Mesh -> Discord: each text broadcast on a paired mesh channel appears once in the Discord
  channel (retransmits, same sender and packet id, are relayed once). Our own packets are never
  relayed, MQTT-sourced ones only with ``relay.mqtt``, DMs never (the mesh side hands over
  broadcasts only).
- Discord -> mesh: ``<name>: text`` (attachments as ``[image]``/``[file]``), fitted with the mesh
  transport's byte-exact numbered chunking to ``relay.max_parts`` packets, and queued in the
  mesh transport's one paced outbox (same spacing and fairness as the bot's answers). Text cut
  to fit gets a reaction (✂️). Over the per-author or per-channel rate limit, or with the
  outbox full, the message is not sent: it gets a reaction (🚫 or ⚠️) and the channel gets one
  short notice per window. Every Discord message is counted as relayed or refused: nothing is
  dropped silently.
- Loop safety: messages by bots, webhooks and the bot itself are never relayed (so nothing the
  relay posted comes back); messages addressed to the AI (trigger, @mention or command) are
  left to the responder unless ``relay.addressed``.
- Privacy: DMs are never relayed; relayed chatter never reaches the responder, so it is stored
  in nobody's memory or index.
- Mesh -> Discord is limited per node and per paired channel (``node_messages``,
  ``mesh_channel_messages``); what is over a limit waits in the channel's backlog and is posted
  together as one digest when the channel's window has room: nothing heard is dropped.
- Replies and reactions cross as replies and reactions, both ways, on relayed messages: the
  bridge remembers which Discord message and which mesh packet are the same message (the
  last ``bridge_parts.LINKS`` of them, in memory). A mesh reply or tapback to a relayed
  message becomes a Discord reply (webhooks cannot reply: a quote line instead) or a reaction
  by the bot; a Discord reply or reaction to a relayed message goes on air with that packet's
  ``reply_id`` (a reaction as a tapback), through the same limits and paced outbox as text. A
  reply or reaction to a message that was never relayed crosses as plain text (replies) or not
  at all (reactions, counted in ``reactions_unmatched``).
- ``counters`` (relayed each way, cut, refused, digests, reactions) are shown by ``!stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bot.bridge_parts import Link, Links, Window, first_id, pages, snippet
from bot.config import RelayConfig
from bot.domain import Delivery, DeliveryStatus

log = logging.getLogger("bot.bridge")

CUT_REACTION = "✂️"
REFUSED_REACTION = "🚫"
FAILED_REACTION = "⚠️"
RATE_NOTICE = (
    "Not relayed to the mesh: at most {n} messages per {s} s {who} (the radio is shared and "
    "slow). Messages marked 🚫 were not sent."
)
FULL_NOTICE = (
    "Not relayed to the mesh: the radio's outbox is full. Messages marked ⚠️ were not sent; "
    "try again in a few minutes."
)
SEEN_PACKETS = 2048
DIGEST_GATHER = 5.0  # seconds a backlog gathers before its digest is posted
DIGEST_HEAD = "-# {n} more from the mesh, over the relay limit ({why}):"
REACTION_NOTICE = (
    "Reactions are relayed to the mesh at most {n} per {s} s {who} (the radio is shared and "
    "slow); the last ones were not sent."
)


@dataclass(frozen=True, slots=True)
class MeshText:
    """A text broadcast heard on a mesh channel."""

    sender: str  # "!1234abcd"
    short_name: str | None
    channel: int
    packet_id: int
    text: str
    addressed: bool = False  # the bot answers it (trigger or command)
    own: bool = False  # sent by our own node
    via_mqtt: bool = False
    hops: int | None = None
    snr: float | None = None
    reply_id: int | None = None  # the packet this one answers (a reply, or a tapback's target)
    tapback: bool = False  # an emoji reaction on ``reply_id`` (the text is the emoji)


@dataclass(frozen=True, slots=True)
class DiscordText:
    """A message in a guild channel that a pair lists."""

    channel_id: int
    message_id: int
    author_name: str
    author_id: int
    text: str  # mentions already rendered as names
    attachments: tuple[str, ...] = ()  # "image" | "file", one per attachment
    from_bot: bool = False  # bots, webhooks, the bot itself
    addressed: bool = False  # the responder answers it
    reply_to: int | None = None  # the message (same channel) this one replies to


@dataclass(frozen=True, slots=True)
class DiscordReaction:
    """A reaction added in a paired channel (unicode emoji only: the mesh shows text)."""

    channel_id: int
    message_id: int
    emoji: str
    user_id: int
    from_bot: bool = False  # bots and the bot itself (its own ✂️/🚫 marks, mirrored tapbacks)


class MeshSide(Protocol):
    def fit_relay(self, text: str, *, max_parts: int) -> str: ...

    async def broadcast(
        self,
        channel: int,
        text: str,
        *,
        person: str,
        max_parts: int,
        reply_id: int | None = None,
        tapback: bool = False,
    ) -> Delivery:
        """Queue ``text`` (already fitted) in the paced outbox; returns when it went out.
        ``message_ids`` of the result are the packets' ids, the first one first."""
        ...


class DiscordSide(Protocol):
    async def relay_post(
        self,
        channel_id: int,
        *,
        name: str,
        node: str,
        text: str,
        reply_to: int | None = None,
        quote: str | None = None,
    ) -> int | None:
        """Post; the new message's id, or None when it could not be posted."""
        ...

    async def relay_react(self, channel_id: int, message_id: int, emoji: str) -> None: ...

    async def relay_notice(self, channel_id: int, message_id: int, text: str) -> None: ...


class Bridge:
    def __init__(
        self,
        config: RelayConfig,
        *,
        mesh: MeshSide,
        discord: DiscordSide,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._config = config
        self._mesh = mesh
        self._discord = discord
        self._clock = clock
        self._sleep = sleep
        self._to_discord: dict[int, list[int]] = {}
        self._to_mesh: dict[int, list[int]] = {}
        for pair in config.pairs:
            if pair.direction in ("both", "mesh_to_discord"):
                self._to_discord.setdefault(pair.mesh_channel, []).append(pair.discord_channel)
            if pair.direction in ("both", "discord_to_mesh"):
                self._to_mesh.setdefault(pair.discord_channel, []).append(pair.mesh_channel)
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._per_author = Window(config.author_messages, config.author_seconds)
        self._per_channel = Window(config.channel_messages, config.channel_seconds)
        self._per_node = Window(config.node_messages, config.node_seconds)
        self._per_post = Window(config.mesh_channel_messages, config.mesh_channel_seconds)
        self._backlog: dict[int, list[tuple[MeshText, str]]] = {}  # Discord channel -> waiting
        self._flushing: set[int] = set()
        self._links = Links()
        self._noticed: dict[tuple[int, str], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.counters = {
            "mesh_to_discord": 0,
            "discord_to_mesh": 0,
            "cut": 0,
            "refused": 0,
            "digests": 0,
            "reactions_to_discord": 0,
            "reactions_to_mesh": 0,
            "reactions_unmatched": 0,
        }

    def stats(self) -> dict[str, int]:
        """For ``!stats`` (one mesh packet): the four main counters, the others when not 0."""
        main = ("mesh_to_discord", "discord_to_mesh", "cut", "refused")
        return {f"relay {k}": v for k, v in self.counters.items() if k in main or v}

    @property
    def discord_channels(self) -> frozenset[int]:
        """Discord channels whose messages the Discord side hands over."""
        return frozenset(self._to_mesh)

    # --- mesh -> Discord ----------------------------------------------------------------------
    def mesh_heard(self, msg: MeshText) -> None:
        """Called by the mesh transport on its event loop; never blocks it."""
        targets = self._to_discord.get(msg.channel)
        if not targets or msg.own or (msg.via_mqtt and not self._config.mqtt):
            return
        if msg.addressed and not self._config.addressed:
            return
        key = (msg.sender, msg.packet_id)
        if msg.packet_id and key in self._seen:
            return  # a retransmit: relayed once
        self._seen[key] = None
        while len(self._seen) > SEEN_PACKETS:
            self._seen.popitem(last=False)
        self._spawn(self._post(msg, targets))

    async def _post(self, msg: MeshText, targets: list[int]) -> None:
        if msg.tapback:
            await self._mirror_tapback(msg, targets)
            return
        text = msg.text
        if self._config.show_signal and (msg.hops is not None or msg.snr is not None):
            bits = [f"{msg.hops} hop(s)" if msg.hops is not None else ""]
            bits.append(f"SNR {msg.snr:g} dB" if msg.snr is not None else "")
            text += "\n-# " + ", ".join(b for b in bits if b)
        now = self._clock()
        over_node = self._per_node.full(msg.sender, now)
        if not over_node:
            self._per_node.note(msg.sender, now)
        for channel_id in targets:
            if over_node or self._per_post.full(channel_id, now) or self._backlog.get(channel_id):
                # Over a limit (or others already waiting: keep the order): posted with the
                # channel's next digest.
                self._backlog.setdefault(channel_id, []).append((msg, text))
                self._spawn(self._flush(channel_id))
                continue
            self._per_post.note(channel_id, now)
            await self._post_one(msg, text, channel_id)

    async def _post_one(self, msg: MeshText, text: str, channel_id: int) -> None:
        name = msg.short_name or msg.sender
        reply_to, quote = None, None
        if msg.reply_id:
            target = next(
                (
                    k
                    for k in self._links.mesh(msg.channel, msg.reply_id)
                    if k.discord_channel == channel_id
                ),
                None,
            )
            if target is not None:
                reply_to, quote = target.discord_message, target.snippet
        posted = await self._discord.relay_post(
            channel_id, name=name, node=msg.sender, text=text, reply_to=reply_to, quote=quote
        )
        if posted is not None:
            self.counters["mesh_to_discord"] += 1
            if msg.packet_id:
                self._links.add(
                    Link(channel_id, posted, msg.channel, msg.packet_id, snippet(name, msg.text))
                )

    async def _flush(self, channel_id: int) -> None:
        """Post the channel's backlog as digests, each when the channel's window has room."""
        if channel_id in self._flushing:
            return
        self._flushing.add(channel_id)
        try:
            while self._backlog.get(channel_id):
                await self._sleep(DIGEST_GATHER)  # a burst gathers into one digest
                await self._room(channel_id)
                waiting = self._backlog.pop(channel_id)
                if len(waiting) == 1:  # one left: a post of its own, reply kept
                    self._per_post.note(channel_id, self._clock())
                    await self._post_one(*waiting[0], channel_id)
                    continue
                cfg = self._config
                why = (
                    f"{cfg.node_messages} per node per {cfg.node_seconds:g} s, "
                    f"{cfg.mesh_channel_messages} per channel per {cfg.mesh_channel_seconds:g} s"
                )
                lines = [
                    f"**{m.short_name or m.sender}** ({m.sender}): {text}" for m, text in waiting
                ]
                for body in pages(DIGEST_HEAD.format(n=len(waiting), why=why), lines):
                    await self._room(channel_id)
                    self._per_post.note(channel_id, self._clock())
                    posted = await self._discord.relay_post(
                        channel_id, name="mesh", node=f"{len(waiting)} messages", text=body
                    )
                    if posted is None:
                        log.warning(
                            "relay: a digest of %d mesh messages was not posted", len(waiting)
                        )
                        continue
                    self.counters["digests"] += 1
                self.counters["mesh_to_discord"] += len(waiting)
        finally:
            self._flushing.discard(channel_id)

    async def _room(self, channel_id: int) -> None:
        """Until the channel's mesh -> Discord window has room for one more post."""
        while (wait := self._per_post.free_in(channel_id, self._clock())) > 0:
            await self._sleep(wait)

    async def _mirror_tapback(self, msg: MeshText, targets: list[int]) -> None:
        links = self._links.mesh(msg.channel, msg.reply_id) if msg.reply_id else []
        mirrored = False
        for link in links:
            if link.discord_channel in targets and self._config.reactions:
                await self._discord.relay_react(
                    link.discord_channel, link.discord_message, msg.text
                )
                self.counters["reactions_to_discord"] += 1
                mirrored = True
        if not mirrored:
            self.counters["reactions_unmatched"] += 1  # on a message that was never relayed

    # --- Discord -> mesh ----------------------------------------------------------------------
    def discord_heard(self, msg: DiscordText) -> None:
        targets = self._to_mesh.get(msg.channel_id)
        if not targets or msg.from_bot:
            return
        if msg.addressed and not self._config.addressed:
            return
        body = " ".join([msg.text.strip(), *(f"[{kind}]" for kind in msg.attachments)]).strip()
        if not body:
            return
        now = self._clock()
        author = (msg.channel_id, msg.author_id)
        if self._per_channel.full(msg.channel_id, now):
            self._refuse(msg, "per_channel")
            return
        if self._per_author.full(author, now):
            self._refuse(msg, "per_author")
            return
        self._per_channel.note(msg.channel_id, now)  # a refused message uses no slot
        self._per_author.note(author, now)
        line = f"{msg.author_name}: {body}"
        fitted = self._mesh.fit_relay(line, max_parts=self._config.max_parts)
        cut = " ".join(fitted.split()) != " ".join(line.split())
        self._spawn(self._send(msg, fitted, targets, cut=cut))

    async def _send(self, msg: DiscordText, text: str, targets: list[int], *, cut: bool) -> None:
        if cut:
            self.counters["cut"] += 1
            await self._discord.relay_react(msg.channel_id, msg.message_id, CUT_REACTION)
        answered = self._links.discord(msg.channel_id, msg.reply_to) if msg.reply_to else None
        for channel in targets:
            delivery = await self._mesh.broadcast(
                channel,
                text,
                person=f"relay:{msg.author_id}",
                max_parts=self._config.max_parts,
                reply_id=(
                    answered.packet_id
                    if answered is not None and answered.mesh_channel == channel
                    else None
                ),
            )
            if delivery.status in (DeliveryStatus.FAILED, DeliveryStatus.PENDING):
                self.counters["refused"] += 1
                log.warning("relay to mesh channel %d failed: %s", channel, delivery.detail)
                await self._discord.relay_react(msg.channel_id, msg.message_id, FAILED_REACTION)
                await self._notice_once(msg.channel_id, msg.message_id, "full", FULL_NOTICE)
                return
            packet = first_id(delivery)
            if packet is not None:
                quote = snippet(msg.author_name, msg.text)
                self._links.add(Link(msg.channel_id, msg.message_id, channel, packet, quote))
        self.counters["discord_to_mesh"] += 1

    def discord_reaction(self, reaction: DiscordReaction) -> None:
        """A reaction in a paired channel: a tapback on air when it is on a relayed message."""
        targets = self._to_mesh.get(reaction.channel_id)
        if not targets or reaction.from_bot or not self._config.reactions:
            return
        link = self._links.discord(reaction.channel_id, reaction.message_id)
        if link is None or link.mesh_channel not in targets:
            self.counters["reactions_unmatched"] += 1
            return
        now = self._clock()
        author = (reaction.channel_id, reaction.user_id)
        cfg = self._config
        for window, key, why, n, s, who in (
            (self._per_channel, reaction.channel_id, "reactions_channel",
             cfg.channel_messages, cfg.channel_seconds, "here"),
            (self._per_author, author, "reactions_author",
             cfg.author_messages, cfg.author_seconds, "each"),
        ):  # fmt: skip
            if window.full(key, now):
                self.counters["refused"] += 1
                notice = REACTION_NOTICE.format(n=n, s=int(s), who=who)
                self._spawn(
                    self._notice_once(reaction.channel_id, reaction.message_id, why, notice)
                )
                return
        self._per_channel.note(reaction.channel_id, now)
        self._per_author.note(author, now)
        self._spawn(self._tapback(reaction, link))

    async def _tapback(self, reaction: DiscordReaction, link: Link) -> None:
        delivery = await self._mesh.broadcast(
            link.mesh_channel,
            reaction.emoji,
            person=f"relay:{reaction.user_id}",
            max_parts=1,
            reply_id=link.packet_id,
            tapback=True,
        )
        if delivery.status in (DeliveryStatus.FAILED, DeliveryStatus.PENDING):
            self.counters["refused"] += 1
            log.warning("relay: a reaction was not sent to the mesh: %s", delivery.detail)
            await self._notice_once(reaction.channel_id, reaction.message_id, "full", FULL_NOTICE)
            return
        self.counters["reactions_to_mesh"] += 1

    def _refuse(self, msg: DiscordText, why: str) -> None:
        self.counters["refused"] += 1
        cfg = self._config
        notice = (
            RATE_NOTICE.format(n=cfg.channel_messages, s=int(cfg.channel_seconds), who="here")
            if why == "per_channel"
            else RATE_NOTICE.format(n=cfg.author_messages, s=int(cfg.author_seconds), who="each")
        )

        async def tell() -> None:
            await self._discord.relay_react(msg.channel_id, msg.message_id, REFUSED_REACTION)
            await self._notice_once(msg.channel_id, msg.message_id, why, notice)

        self._spawn(tell())

    async def _notice_once(self, channel_id: int, message_id: int, why: str, text: str) -> None:
        """One notice per channel and reason per window; reactions mark each message."""
        key = (channel_id, why)
        now = self._clock()
        window = self._config.channel_seconds
        if now - self._noticed.get(key, -1e18) < window:
            return
        self._noticed[key] = now
        await self._discord.relay_notice(channel_id, message_id, text)

    # --- lifecycle ----------------------------------------------------------------------------
    def _spawn(self, coro: object) -> None:
        assert asyncio.iscoroutine(coro)
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("relay task failed", exc_info=task.exception())

    async def idle(self) -> None:
        """Until every relay in flight is done (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
