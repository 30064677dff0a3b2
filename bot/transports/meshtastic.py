"""Meshtastic transport: a courteous, reliable bot on a LoRa mesh, through one local radio.

Four modules, one class: ``meshtastic_link`` (the library interface, its worker thread,
reconnects, the watchdog), ``meshtastic_outbox`` (fair paced sending and ACK bookkeeping; its
docstring states the sending model), ``meshtastic_holds`` (capacity, why replies wait, the
airtime rules at each write) and this one (receiving, the Transport protocol, wiring).
Text fitting lives in ``mesh_text``, receive rules and bookkeeping in ``mesh_rules``, the
bridge's view of a channel text and the node table's names in ``mesh_heard`` (all pure).
Only ``meshtastic*.py`` modules import ``meshtastic``/``pubsub``.

Invariants:
- A received text is answered only when ``mesh_rules.classify`` accepts it (DMs; channel texts
  with the trigger as first word, an @mention, or a known command) and it is not a copy of a
  packet already seen (same sender and packet id: rebroadcasts, MQTT). The same words in a new
  packet are a new message. Untriggered channel chatter is logged at DEBUG only.
- ``fit``/``fit_more`` are pure and give exactly what ``send`` puts on air; a cut answer ends
  with `` … (!more)`` and the rest is kept by the responder for ``!more``.
- ``send`` never raises; it returns a ``Delivery`` (DELIVERED / SENT / FAILED / PENDING).
- Bridge (``relay:``): every text broadcast heard is handed to ``channel_listener`` (when set)
  as a ``MeshText``, before the answer rules and dedup (the bridge dedups itself);
  ``broadcast`` queues relayed text in the same fair, paced outbox as replies (refused while
  the outbox is busy: answers come first).
- Who speaks (``mesh_keys.Admission``, its pins wired by app.py): a DM is handed on
  ``authenticated`` only when it arrived PKI-encrypted with the key pinned for its node; a DM
  for a pinned node without that key never reaches the responder (its node is told, at most
  once per ``REFUSAL_NOTICE_SECONDS``); channel texts are never authenticated.
- Message text is never logged above DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from bot.bridge import MeshText
from bot.config import MeshtasticConfig
from bot.domain import (
    DM_SPACE,
    Delivery,
    DeliveryStatus,
    Inbound,
    Reply,
    ReplyKind,
    TransportLimits,
)
from bot.errors import TransportError
from bot.transports.base import OnMessage, Transport, TransportHealth
from bot.transports.mesh_airtime import HOUR, Pacer
from bot.transports.mesh_heard import long_name, node_table, relay_text
from bot.transports.mesh_keys import REFUSED, Admission, packet_key
from bot.transports.mesh_rules import (
    BROADCAST_NUM,
    Accepted,
    Clock,
    Cooldown,
    Dedup,
    Dropped,
    ReceiveRules,
    SystemClock,
    classify,
    node_id,
    node_num,
    space_channel,
)
from bot.transports.mesh_strangers import Allowance, Strangers
from bot.transports.mesh_text import (
    MARKER,
    fit,
    fit_more,
    render_parts,
    split_parts,
    utf8_len,
)
from bot.transports.mesh_view import MeshView, NodeBook, nodes_seen
from bot.transports.meshtastic_holds import _Job, _Part, _why
from bot.transports.meshtastic_link import (
    EARLY_LIMIT,
    TOPIC_LOST,
    TOPIC_RECEIVE,
    InterfaceFactory,
    RadioInterface,
    _Counter,
    _Worker,
    default_interface_factory,
    metrics_from,
)
from bot.transports.meshtastic_outbox import MeshOutbox

log = logging.getLogger("bot.transport.meshtastic")

INBOUND_LIMIT = 64  # messages waiting for on_message; beyond that the radio is flooding us
INBOUND_DRAIN_SECONDS = 5.0
HARD_LIMIT_FACTOR = 4  # beyond outbox_limit * this, send() answers PENDING (the outbox waits)
QUIET_DROPS = frozenset({"no trigger"})  # plus "channel N not enabled": everyday chatter

__all__ = ["MeshtasticTransport", "build_meshtastic", "default_interface_factory", "running"]


class MeshtasticTransport(MeshOutbox):
    """See the module docstring. Build it with ``build_meshtastic``."""

    name = "meshtastic"

    def __init__(
        self,
        *,
        config: MeshtasticConfig,
        bot_name: str,
        command_prefix: str,
        interface_factory: InterfaceFactory,
        clock: Clock,
        rng: random.Random | None = None,
        command_names: tuple[str, ...] = (),
    ) -> None:
        self._cfg = config
        self._factory = interface_factory
        self._clock = clock
        self._rng = rng or random.Random()
        self._marker = f"{MARKER} ({command_prefix}more)"
        capacity = config.chunk_bytes * config.max_parts
        self.limits = TransportLimits(
            context_tokens=config.context_tokens,
            max_tokens=config.max_tokens,
            style_hint=(
                "You are answering over LoRa radio: reply in plain text, no markdown or lists, "
                f"ideally under {config.chunk_bytes} bytes (about {config.chunk_bytes // 6} words) "
                f"and never more than {capacity} bytes."
            ),
        )
        self._rules = ReceiveRules(
            channels=frozenset(config.channels),
            mention=config.trigger or f"@{bot_name}",
            command_prefix=command_prefix if config.prefix_trigger else None,
            ignore_nodes=frozenset(node_num(n) for n in config.ignore_nodes),
            ignore_mqtt=config.ignore_mqtt,
            commands=frozenset(command_names) if command_names else frozenset({"help"}),
        )
        self._dedup = Dedup(window=config.dedup_seconds)
        self._channel_cooldown = Cooldown(seconds=config.channel_cooldown)
        self._reply_cooldown = Cooldown(seconds=config.cooldown)
        self._worker = _Worker("meshtastic-io")
        self._on_message: OnMessage | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._iface: RadioInterface | None = None
        self._my_num: int | None = None
        self._connecting = False
        self._early: deque[tuple[dict[str, Any], object]] = deque(maxlen=EARLY_LIMIT)
        self._reports: deque[float] = deque(maxlen=4)
        self._up = asyncio.Event()
        self._lost = asyncio.Event()
        self._lost_reason = ""
        self._generation = 0  # increments on every successful connect
        self._link_changed = asyncio.Event()  # replaced (after being set) on every transition
        self._stopping = False
        self._closed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # each message with the PKI key it arrived with (None: no PKI), identified in order
        self._inbound: asyncio.Queue[tuple[Inbound, bytes | None]] = asyncio.Queue(
            maxsize=INBOUND_LIMIT
        )
        self.admission = Admission()  # who speaks (mesh_keys); app.py wires its pins
        self._jobs: list[_Job] = []
        self._jobs_changed = asyncio.Event()
        self._acks: dict[int, tuple[_Job, _Part]] = {}
        # Routing answers can overtake the worker's return of the packet id: keep recent ones.
        self._recent_routing: OrderedDict[int, tuple[int | None, str]] = OrderedDict()
        self._confirmed: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._last_tx = float("-inf")
        self._last_rx = clock.monotonic()
        self._traffic = asyncio.Event()
        self._pacer = Pacer(
            spacing=config.spacing_seconds,
            channel_limit=config.busy_threshold,
            duty_cycle=config.duty_cycle,
            poll=config.busy_poll,
        )
        self._strangers = Strangers(
            allowance=Allowance(
                seconds_per_hour=HOUR * config.duty_cycle / 100 * config.stranger_share / 100
            ),
            stranger_retries=config.stranger_retries,
        )
        self._metrics_said = False  # "no device metrics" is logged once
        self._held = ""  # why the outbox is holding replies now ("" when it is not)
        self._hold_reason = ""
        self._hold_started = 0.0
        self._stale_said = False
        self._dm_channel: dict[int, int] = {}
        self.channel_listener: Callable[[MeshText], None] | None = None  # the bridge, if any
        self._subscribed = False
        self._closing = _Counter()
        self._broken = ""  # name of a loop that ended with an exception (health: not ok)
        self._nodes = NodeBook()  # signal and counts per node, for the operator's view
        self._holds: Counter[str] = Counter()  # holds started, by cause (operator's view)
        self._holding = ""  # why a part is held right now ("" when none is)

    # --- Transport protocol ----------------------------------------------------------------
    def fit(self, text: str) -> str:
        return self.fit_more(text)[0]

    def fit_more(self, text: str) -> tuple[str, str | None]:
        return fit_more(
            text,
            chunk_bytes=self._cfg.chunk_bytes,
            max_parts=self._cfg.max_parts,
            marker=self._marker,
        )

    def working(self, inbound: Inbound) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()  # no "thinking..." on the mesh

    async def start(self, on_message: OnMessage) -> None:
        if self._loop is not None:
            raise TransportError("the meshtastic transport was already started")
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        from pubsub import pub

        pub.subscribe(self._on_packet, TOPIC_RECEIVE)
        pub.subscribe(self._on_lost, TOPIC_LOST)
        self._subscribed = True
        for coro in (self._link_loop(), self._inbound_loop(), self._outbox_loop()):
            self._spawn(coro)
        if self._cfg.stale_after > 0:
            self._spawn(self._watchdog())

    async def send(self, reply: Reply) -> Delivery:
        if self._loop is None or self._stopping:
            return Delivery(
                DeliveryStatus.PENDING, detail="the meshtastic transport is not running"
            )
        try:
            job = self._make_job(reply)
        except ValueError as exc:
            return Delivery(DeliveryStatus.FAILED, detail=str(exc))
        if not job.parts:
            return Delivery(DeliveryStatus.FAILED, detail="nothing to send (empty reply)")
        if len(self._jobs) >= self._cfg.outbox_limit * HARD_LIMIT_FACTOR:
            log.warning("outbox full (%d replies waiting); one waits for later", len(self._jobs))
            return Delivery(DeliveryStatus.PENDING, detail="outbox full")
        if reply.attachments:
            log.info("attachments cannot go over the mesh; sending the text only")
        self._jobs.append(job)
        self._jobs_changed.set()
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            self._drop(job)
            raise

    async def stop(self) -> None:
        if self._stopping:
            await self._closed.wait()
            return
        self._stopping = True
        self._unsubscribe()
        with contextlib.suppress(TimeoutError):  # messages already received get stored
            await asyncio.wait_for(self._inbound.join(), INBOUND_DRAIN_SECONDS)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for job in list(self._jobs):
            self._finish(job, Delivery(DeliveryStatus.PENDING, detail="transport stopped"))
        iface, self._iface = self._iface, None
        if iface is not None:
            await self._close_interface(iface)
        self._worker.shutdown()
        self._closed.set()
        log.info("meshtastic transport stopped")

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- receiving (loop thread) --------------------------------------------------------------
    def _packet_in(self, packet: dict[str, Any], interface: object) -> None:
        if self._stopping:
            return
        if interface is not self._iface or self._iface is None:
            if self._connecting:
                self._early.append((packet, interface))
            return
        self._last_rx = self._clock.monotonic()
        self._traffic.set()
        frm = packet.get("from")
        if isinstance(frm, int) and frm != self._my_num:
            snr, rssi = packet.get("rxSnr"), packet.get("rxRssi")
            self._nodes.heard(
                node_id(frm),
                snr=float(snr) if isinstance(snr, int | float) else None,
                rssi=int(rssi) if isinstance(rssi, int) else None,
                at=time.time(),
            )
        decoded = packet.get("decoded")
        port = decoded.get("portnum") if isinstance(decoded, Mapping) else None
        if port == "ROUTING_APP" and isinstance(decoded, Mapping):
            self._routing_in(packet, decoded)
            return
        if port == "TELEMETRY_APP" and packet.get("from") == self._my_num:
            telemetry = decoded.get("telemetry") if isinstance(decoded, Mapping) else None
            if isinstance(telemetry, Mapping) and isinstance(telemetry.get("deviceMetrics"), dict):
                self._report_seen()
                self._metrics_in(metrics_from(telemetry.get("deviceMetrics")))
            return
        if self._my_num is None:
            return
        verdict = classify(packet, my_num=self._my_num, rules=self._rules)
        if self.channel_listener is not None:  # the bridge: channel texts, before the rules
            heard = relay_text(
                packet, addressed=isinstance(verdict, Accepted), my_num=self._my_num,
                nodes=self._iface,
            )  # fmt: skip
            if heard is not None:
                self.channel_listener(heard)
        if isinstance(verdict, Dropped):
            if verdict.reason in QUIET_DROPS or verdict.reason.endswith(
                "not enabled"
            ):  # channel chatter: not for us, not worth INFO
                log.debug("ignored a packet from %s: %s", _sender(packet), verdict.reason)
            elif port == "TEXT_MESSAGE_APP" or verdict.reason.startswith("could not decrypt"):
                log.info("ignored a packet from %s: %s", _sender(packet), verdict.reason)
            else:
                log.debug("ignored a packet from %s: %s", _sender(packet), verdict.reason)
            return
        self._accept(verdict, packet)

    def _accept(self, msg: Accepted, packet: Mapping[str, Any]) -> None:
        now = self._clock.monotonic()
        if self._dedup.is_duplicate(sender=msg.sender_num, packet_id=msg.packet_id, now=now):
            log.info("dropped a duplicate from %s (packet %08x)", msg.sender, msg.packet_id)
            return
        if not msg.is_dm:
            key = f"{msg.sender}@{msg.space}"
            if now < self._channel_cooldown.ready_at(key):
                log.info("channel cooldown: ignoring another trigger from %s", msg.sender)
                return
            self._channel_cooldown.note(key, now)
        else:
            self._dm_channel[msg.sender_num] = msg.channel
        if msg.repaired_utf8:
            log.warning("message from %s had invalid UTF-8; replaced the bad bytes", msg.sender)
        inbound = Inbound(
            transport=self.name,
            sender=msg.sender,
            text=msg.text,
            space=msg.space,
            message_id=str(msg.packet_id) if msg.packet_id else None,
            reply_to=str(msg.reply_to) if msg.reply_to else None,
            sender_name=long_name(self._iface, msg.sender_num),
        )
        try:
            self._inbound.put_nowait((inbound, packet_key(packet)))
        except asyncio.QueueFull:
            log.warning("inbound queue full; dropping a message from %s", msg.sender)
            return
        self._nodes.message_from(msg.sender)
        log.info(
            "message from %s in %s (%d bytes, %d hops)",
            msg.sender,
            msg.space,
            utf8_len(msg.text),
            max(0, int(packet.get("hopStart", 0)) - int(packet.get("hopLimit", 0))),
        )

    # --- bridge: relayed text out -------------------------------------------------------------
    def fit_relay(self, text: str, *, max_parts: int) -> str:
        return fit(text, chunk_bytes=self._cfg.chunk_bytes, max_parts=max_parts)

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
        """Relayed text as numbered broadcast parts on ``channel``, through the fair, paced
        outbox (behind and between the bot's answers, never around them). ``reply_id`` marks
        the first part as a reply to that packet; ``tapback`` sends ``text`` (one emoji) as a
        reaction on it."""
        if self._loop is None or self._stopping:
            return Delivery(DeliveryStatus.FAILED, detail="the meshtastic transport is not running")
        if self.busy_for() is not None:  # answers first: relay only when there is room
            log.warning("outbox busy (%d waiting); refusing relayed text", len(self._jobs))
            return Delivery(DeliveryStatus.FAILED, detail="outbox full")
        texts = render_parts(
            split_parts(
                self.fit_relay(text, max_parts=max_parts),
                chunk_bytes=self._cfg.chunk_bytes,
                max_parts=max_parts,
            )
        )
        if not texts:
            return Delivery(DeliveryStatus.FAILED, detail="nothing to send")
        inbound = Inbound(
            transport=self.name,
            sender=person,
            text="",
            space=f"ch{channel}",
            message_id=str(reply_id) if reply_id else None,  # the outbox's reply_id
        )
        job = _Job(
            reply=Reply(inbound=inbound, text=text, kind=ReplyKind.NOTICE),
            person=person,
            dest=BROADCAST_NUM,
            channel=channel,
            want_ack=False,
            parts=[_Part(i, t) for i, t in enumerate(texts)],
            enqueued_at=self._clock.monotonic(),
            future=asyncio.get_running_loop().create_future(),
            relay=True,
            tapback=tapback and reply_id is not None,
        )
        self._jobs.append(job)
        self._jobs_changed.set()
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            self._drop(job)
            raise

    async def _inbound_loop(self) -> None:
        while True:
            inbound, key = await self._inbound.get()
            assert self._on_message is not None
            try:
                now = self._clock.monotonic()
                admitted, tell = await self.admission.admit(inbound, key, now=now)
                if admitted is not None:
                    await self._on_message(admitted)
                elif tell:  # not that person: its node hears why, in one packet
                    self._spawn(self._tell_refused(inbound))
            except Exception:  # loop boundary: one bad message must not stop the radio
                log.exception("storing a message from %s failed", inbound.sender)
            finally:
                self._inbound.task_done()

    async def _tell_refused(self, inbound: Inbound) -> None:
        await self.send(Reply(inbound=inbound, text=self.fit(REFUSED), kind=ReplyKind.NOTICE))

    # --- sending ------------------------------------------------------------------------------
    def _make_job(self, reply: Reply) -> _Job:
        inbound = reply.inbound
        sender = node_num(inbound.sender)
        self._nodes.reply_to(inbound.sender)
        text = self.fit(reply.text)
        texts = render_parts(
            split_parts(text, chunk_bytes=self._cfg.chunk_bytes, max_parts=self._cfg.max_parts)
        )
        if inbound.space == DM_SPACE:
            dest, channel, want_ack = sender, self._dm_channel.get(sender, 0), self._cfg.want_ack
        else:
            index = space_channel(inbound.space)
            if index is None:
                raise ValueError(f"unknown mesh space {inbound.space!r}")
            if self._cfg.reply_in_channel:
                dest, channel, want_ack = BROADCAST_NUM, index, False
            else:
                dest, channel, want_ack = sender, index, self._cfg.want_ack
        planned = dict(reply.packet_ids)  # ids an earlier run chose (and perhaps wrote)
        # A part an earlier send wrote is done, unless it waits for an ACK nobody saw (the row
        # is still pending; this run did not confirm it) and has its planned id: the library
        # reports a write on a TCP link it is silently re-opening as done, so the part may
        # never have reached the radio. It is written again with that id: a receiver that has
        # it drops the repeat (not shown; the part ends ``sent``), one that has not shows it.
        row = reply.outbox_id

        def done(i: int) -> bool:
            if i not in reply.done_parts or not want_ack or i not in planned:
                return i in reply.done_parts
            return row is not None and (row, i) in self._confirmed

        parts = [
            _Part(
                i,
                t,
                state="done" if done(i) else "todo",
                packet_id=planned.get(i),
                repeat=i in planned,
            )
            for i, t in enumerate(texts)
        ]
        loop = asyncio.get_running_loop()
        return _Job(
            reply=reply,
            person=inbound.sender,
            dest=dest,
            channel=channel,
            want_ack=want_ack,
            parts=parts,
            enqueued_at=self._clock.monotonic(),
            future=loop.create_future(),
        )

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._broken = task.get_name()
            log.error("meshtastic task ended unexpectedly", exc_info=task.exception())

    def health(self) -> TransportHealth:
        """Link state and outbox depth; not ok once a loop has died (the watchdog restarts us)."""
        if self._closed.is_set() or self._stopping:
            return TransportHealth(link="closed", outbox=len(self._jobs))
        link = "up" if self._up.is_set() else "connecting" if self._connecting else "down"
        detail = f"loop {self._broken} died" if self._broken else self._lost_reason
        if link == "up" and not self._broken and self._hold_reason:  # not a fault: say why
            held = self._clock.monotonic() - self._hold_started
            detail = f"holding replies {held:.0f} s: {_why(self._hold_reason)}"
        return TransportHealth(
            link=link, loop_ok=not self._broken, detail=detail, outbox=len(self._jobs)
        )

    def mesh_view(self) -> MeshView:
        """The operator's view (``bot.transports.mesh_view``): cheap, non-blocking; the
        library's node table is copied here (its thread may be writing it)."""
        now = self._clock.monotonic()
        table = node_table(self._iface)
        me = node_id(self._my_num) if self._my_num is not None else None
        m = self._pacer.metrics
        return MeshView(
            link=self.health().link,
            channel_utilization=m.channel_utilization,
            air_util_tx=m.air_util_tx,
            bot_hour_share=self._pacer.own_share(now, 3600.0),
            others=self._pacer.others(now),
            channel_limit=self._cfg.busy_threshold,
            duty_cycle=self._cfg.duty_cycle,
            holding=self._holding,
            holds=dict(self._holds),
            outbox_waiting=len(self._jobs),
            nodes=tuple(nodes_seen(table, self._nodes, my_id=me)),
            stranger_airtime=self._strangers.allowance.used(now),
            stranger_allowance=self._strangers.allowance.seconds_per_hour,
            strangers_refused=self._strangers.refused,
        )


def _sender(packet: Mapping[str, Any]) -> str:
    frm = packet.get("from")
    return node_id(frm) if isinstance(frm, int) else "?"


# --- construction ------------------------------------------------------------------------------


def build_meshtastic(
    config: MeshtasticConfig,
    *,
    bot_name: str,
    command_prefix: str,
    command_names: tuple[str, ...] = (),
    interface_factory: InterfaceFactory | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> Transport:
    """The Meshtastic transport for ``config``; ``interface_factory``/``clock`` are for tests.
    ``command_names`` are the commands that trigger on a channel (others, e.g. another bot's
    ``!ping``, do not)."""
    factory = interface_factory or default_interface_factory(config)
    return MeshtasticTransport(
        config=config,
        bot_name=bot_name,
        command_prefix=command_prefix,
        command_names=command_names,
        interface_factory=factory,
        clock=clock or SystemClock(),
        rng=rng,
    )


@contextlib.asynccontextmanager
async def running(transport: MeshtasticTransport, on_message: OnMessage) -> AsyncIterator[None]:
    """``async with running(t, handler):`` start, then always stop (tests, tools)."""
    await transport.start(on_message)
    try:
        yield
    finally:
        await transport.stop()
