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
- ``counters`` (relayed each way, cut, refused) are shown by ``!stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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


class MeshSide(Protocol):
    def fit_relay(self, text: str, *, max_parts: int) -> str: ...

    async def broadcast(self, channel: int, text: str, *, person: str, max_parts: int) -> Delivery:
        """Queue ``text`` (already fitted) in the paced outbox; returns when it went out."""
        ...


class DiscordSide(Protocol):
    async def relay_post(self, channel_id: int, *, name: str, node: str, text: str) -> bool: ...

    async def relay_react(self, channel_id: int, message_id: int, emoji: str) -> None: ...

    async def relay_notice(self, channel_id: int, message_id: int, text: str) -> None: ...


class _Window:
    """At most ``count`` events per ``seconds`` per key (sliding window)."""

    def __init__(self, count: int, seconds: float) -> None:
        self.count, self.seconds = count, seconds
        self._stamps: dict[object, deque[float]] = {}

    def full(self, key: object, now: float) -> bool:
        stamps = self._stamps.setdefault(key, deque())
        while stamps and now - stamps[0] >= self.seconds:
            stamps.popleft()
        if not stamps:
            del self._stamps[key]  # keep the table as small as the set of active keys
            return False
        return len(stamps) >= self.count

    def note(self, key: object, now: float) -> None:
        self._stamps.setdefault(key, deque()).append(now)


class Bridge:
    def __init__(
        self,
        config: RelayConfig,
        *,
        mesh: MeshSide,
        discord: DiscordSide,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._mesh = mesh
        self._discord = discord
        self._clock = clock
        self._to_discord: dict[int, list[int]] = {}
        self._to_mesh: dict[int, list[int]] = {}
        for pair in config.pairs:
            if pair.direction in ("both", "mesh_to_discord"):
                self._to_discord.setdefault(pair.mesh_channel, []).append(pair.discord_channel)
            if pair.direction in ("both", "discord_to_mesh"):
                self._to_mesh.setdefault(pair.discord_channel, []).append(pair.mesh_channel)
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._per_author = _Window(config.author_messages, config.author_seconds)
        self._per_channel = _Window(config.channel_messages, config.channel_seconds)
        self._noticed: dict[tuple[int, str], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.counters = {"mesh_to_discord": 0, "discord_to_mesh": 0, "cut": 0, "refused": 0}

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
        text = msg.text
        if self._config.show_signal and (msg.hops is not None or msg.snr is not None):
            bits = [f"{msg.hops} hop(s)" if msg.hops is not None else ""]
            bits.append(f"SNR {msg.snr:g} dB" if msg.snr is not None else "")
            text += "\n-# " + ", ".join(b for b in bits if b)
        for channel_id in targets:
            name = msg.short_name or msg.sender
            if await self._discord.relay_post(channel_id, name=name, node=msg.sender, text=text):
                self.counters["mesh_to_discord"] += 1

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
        for channel in targets:
            delivery = await self._mesh.broadcast(
                channel, text, person=f"relay:{msg.author_id}", max_parts=self._config.max_parts
            )
            if delivery.status in (DeliveryStatus.FAILED, DeliveryStatus.PENDING):
                self.counters["refused"] += 1
                log.warning("relay to mesh channel %d failed: %s", channel, delivery.detail)
                await self._discord.relay_react(msg.channel_id, msg.message_id, FAILED_REACTION)
                await self._notice_once(msg, "full", FULL_NOTICE)
                return
        self.counters["discord_to_mesh"] += 1

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
            await self._notice_once(msg, why, notice)

        self._spawn(tell())

    async def _notice_once(self, msg: DiscordText, why: str, text: str) -> None:
        """One notice per channel and reason per window; reactions mark each message."""
        key = (msg.channel_id, why)
        now = self._clock()
        window = self._config.channel_seconds
        if now - self._noticed.get(key, -1e18) < window:
            return
        self._noticed[key] = now
        await self._discord.relay_notice(msg.channel_id, msg.message_id, text)

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
