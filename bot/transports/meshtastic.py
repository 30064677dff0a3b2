"""Meshtastic transport: a courteous, reliable bot on a LoRa mesh, through one local radio.

The only module that imports ``meshtastic``/``pubsub``. Text fitting lives in ``mesh_text``,
receive rules and bookkeeping in ``mesh_rules`` (both pure).

Invariants:
- Threads: the library calls our pubsub listeners on its "publishing" thread; they only hand
  packets to the event loop (``call_soon_threadsafe``). pypubsub holds weak references, so the
  listeners are bound methods of this object, which the app keeps alive; ``stop`` unsubscribes.
- Every blocking library call (connect, send, probe) runs on one worker thread, so sends keep
  their order and the loop never blocks. ``SystemExit`` from the library's ``sys.exit`` traps
  is caught there. A call that outlives ``call_timeout`` marks the link down; the wedged
  thread is abandoned and a fresh one takes over. These two timeouts (``call_timeout``,
  ``connect_timeout``) guard real blocked threads, so they run on real time; everything else
  (pacing, ACK waits, backoff, cooldowns, probes) runs on the injected clock.
- No library interface is ever left open: one that finishes connecting after we gave up is
  closed at once, a half-built BLE interface is closed, and closing first releases the
  library's unbounded wait for TX-queue space (otherwise close() itself hangs and a serial
  port stays locked).
- One paced outbox: whole replies, one at a time (two people never interleave), parts
  numbered ``(i/n)``; at least ``spacing_seconds`` between any two text packets, measured on
  the injected clock from the end of one write to the start of the next.
- DMs go out with wantAck. We read every routing packet ourselves (``meshtastic.receive``), so
  plain ACKs are seen too (the library hides them from onResponse unless asked). An ACK from
  the destination delivers a part; a NAK or no answer within ``ack_timeout`` re-sends only that
  part, at most ``ack_retries`` times with doubling backoff. An ACK relayed by another node
  (implicit ACK) means "on the mesh": no re-send, reported as SENT.
- ``send`` never raises; it returns a ``Delivery`` (DELIVERED / SENT / FAILED + detail).
- The link is rebuilt forever with exponential backoff and jitter (``reconnect_initial`` doubling
  to ``reconnect_max``) after connection.lost, a timed-out call, or a stale link (quiet for
  ``stale_after`` and a failed probe); the old interface is closed defensively off-loop. A radio
  that is absent at startup is retried the same way; ``start`` does not wait for it. Replies
  wait for the link at most ``queue_wait`` seconds.
- Bridge (``relay:``): every text broadcast heard is handed to ``channel_listener`` (when set)
  as a ``MeshText``, before the answer rules and dedup (the bridge dedups itself);
  ``broadcast`` queues relayed text in the same paced outbox as replies.
- Message text is never logged above DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import socket
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

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
from bot.errors import ConfigError, TransportError
from bot.transports.base import OnMessage, Transport
from bot.transports.mesh_rules import (
    BROADCAST_NUM,
    Accepted,
    Backoff,
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
from bot.transports.mesh_text import fit, render_parts, split_parts, utf8_len

log = logging.getLogger("bot.transport.meshtastic")

T = TypeVar("T")

TOPIC_RECEIVE = "meshtastic.receive"  # parent topic: every packet (text, routing, admin, ...)
TOPIC_LOST = "meshtastic.connection.lost"
INBOUND_LIMIT = 64  # messages waiting for on_message; beyond that the radio is flooding us
EARLY_LIMIT = 64  # packets that arrive while an interface is still being built
CLOSE_TIMEOUT = 10.0
# The library's own waits on top of connect_timeout (a hard-coded 30 s for the first answer).
CONNECT_MARGIN = 45.0
INBOUND_DRAIN_SECONDS = 5.0


class RadioInterface(Protocol):
    """The part of ``meshtastic.mesh_interface.MeshInterface`` this transport uses."""

    myInfo: Any
    nodesByNum: Any

    def sendData(self, data: Any, *args: Any, **kwargs: Any) -> Any: ...

    def close(self) -> None: ...


InterfaceFactory = Callable[[], RadioInterface]


class _Stopped(Exception):
    pass


# --- the worker thread ---------------------------------------------------------------------


class _Worker:
    """One daemon thread running blocking calls in order; results come back to the loop."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._pending = 0  # jobs queued or running, counted down by the thread itself
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._pending > 0

    async def call(self, fn: Callable[[], T], *, timeout: float) -> T:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending += 1
        self._jobs.put((fn, fut))
        return await asyncio.wait_for(fut, timeout)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut = job
            try:
                if fut.done():  # the caller gave up (timeout, stop) before we got to it
                    continue
                result = fn()
            except SystemExit as exc:  # meshtastic.util.our_exit: must never end the bot
                _resolve(fut, None, TransportError(f"meshtastic library refused: {exc}"))
            except BaseException as exc:
                _resolve(fut, None, exc)
            else:
                _resolve(fut, result, None)
            finally:
                with self._lock:
                    self._pending -= 1

    def shutdown(self) -> None:
        self._jobs.put(None)


class _Counter:
    """A thread-safe count of operations under way."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            self._n += 1

    def release(self) -> None:
        with self._lock:
            self._n -= 1

    @property
    def busy(self) -> bool:
        return self._n > 0


def _resolve(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    def apply() -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is already closed
        fut.get_loop().call_soon_threadsafe(apply)


# --- outbox bookkeeping ----------------------------------------------------------------------


@dataclass
class _Job:
    reply: Reply
    person: str
    dest: int
    channel: int
    want_ack: bool
    parts: list[str]
    enqueued_at: float
    future: asyncio.Future[Delivery]


@dataclass
class _AckWait:
    dest: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    sent_at: float = 0.0
    state: str = "pending"  # pending | relayed | ack | nak
    reason: str = ""


# --- the transport ----------------------------------------------------------------------------


class MeshtasticTransport:
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
    ) -> None:
        self._cfg = config
        self._factory = interface_factory
        self._clock = clock
        self._rng = rng or random.Random()
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
        self._up = asyncio.Event()
        self._lost = asyncio.Event()
        self._lost_reason = ""
        self._generation = 0  # increments on every successful connect
        self._link_changed = asyncio.Event()  # replaced (after being set) on every transition
        self._stopping = False
        self._closed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._inbound: asyncio.Queue[Inbound] = asyncio.Queue(maxsize=INBOUND_LIMIT)
        self._jobs: list[_Job] = []
        self._jobs_changed = asyncio.Event()
        self.channel_listener: Callable[[MeshText], None] | None = None  # the bridge, if any
        self._acks: dict[int, _AckWait] = {}
        # Routing answers can overtake the worker's return of the packet id: keep recent ones.
        self._recent_routing: OrderedDict[int, tuple[int | None, str]] = OrderedDict()
        self._last_tx = float("-inf")
        self._last_rx = clock.monotonic()
        self._traffic = asyncio.Event()
        self._channel_util: float | None = None
        self._dm_channel: dict[int, int] = {}
        self._subscribed = False
        self._closing = _Counter()

    # --- Transport protocol ----------------------------------------------------------------
    def fit(self, text: str) -> str:
        return fit(text, chunk_bytes=self._cfg.chunk_bytes, max_parts=self._cfg.max_parts)

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
            return Delivery(DeliveryStatus.FAILED, detail="the meshtastic transport is not running")
        try:
            job = self._make_job(reply)
        except ValueError as exc:
            return Delivery(DeliveryStatus.FAILED, detail=str(exc))
        if not job.parts:
            return Delivery(DeliveryStatus.FAILED, detail="nothing to send (empty reply)")
        if len(self._jobs) >= self._cfg.outbox_limit:
            log.warning("outbox full (%d replies waiting); refusing one", len(self._jobs))
            return Delivery(DeliveryStatus.FAILED, detail="outbox full")
        if reply.attachments:
            log.info("attachments cannot go over the mesh; sending the text only")
        self._jobs.append(job)
        self._jobs_changed.set()
        return await job.future

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
        for job in self._jobs:
            if not job.future.done():
                job.future.set_result(Delivery(DeliveryStatus.FAILED, detail="transport stopped"))
        self._jobs.clear()
        iface, self._iface = self._iface, None
        if iface is not None:
            await self._close_interface(iface)
        self._worker.shutdown()
        self._closed.set()
        log.info("meshtastic transport stopped")

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- pubsub listeners (publishing thread) -------------------------------------------------
    def _on_packet(self, packet: dict[str, Any], interface: object) -> None:
        loop = self._loop
        if loop is not None and not self._stopping:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(self._packet_in, packet, interface)

    def _on_lost(self, interface: object) -> None:
        loop = self._loop
        if loop is not None and not self._stopping:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._lost_in, interface)

    def _unsubscribe(self) -> None:
        if not self._subscribed:
            return
        from pubsub import pub

        for listener, topic in ((self._on_packet, TOPIC_RECEIVE), (self._on_lost, TOPIC_LOST)):
            with contextlib.suppress(Exception):  # topic never created: nothing to undo
                pub.unsubscribe(listener, topic)
        self._subscribed = False

    # --- receiving (loop thread) --------------------------------------------------------------
    def _lost_in(self, interface: object) -> None:
        if interface is self._iface and self._iface is not None:
            self._link_down("connection lost")

    def _packet_in(self, packet: dict[str, Any], interface: object) -> None:
        if self._stopping:
            return
        if interface is not self._iface or self._iface is None:
            if self._connecting:
                self._early.append((packet, interface))
            return
        self._last_rx = self._clock.monotonic()
        self._traffic.set()
        decoded = packet.get("decoded")
        port = decoded.get("portnum") if isinstance(decoded, Mapping) else None
        if port == "ROUTING_APP" and isinstance(decoded, Mapping):
            self._routing_in(packet, decoded)
            return
        if port == "TELEMETRY_APP" and packet.get("from") == self._my_num:
            metrics = decoded.get("telemetry", {}).get("deviceMetrics", {})  # type: ignore[union-attr]
            if "channelUtilization" in metrics:
                self._channel_util = float(metrics["channelUtilization"])
            return
        if self._my_num is None:
            return
        verdict = classify(packet, my_num=self._my_num, rules=self._rules)
        if self.channel_listener is not None:
            self._tap(packet, addressed=isinstance(verdict, Accepted))
        if isinstance(verdict, Dropped):
            if port == "TEXT_MESSAGE_APP" or verdict.reason.startswith("could not decrypt"):
                log.info("ignored a packet from %s: %s", _sender(packet), verdict.reason)
            else:
                log.debug("ignored a packet from %s: %s", _sender(packet), verdict.reason)
            return
        self._accept(verdict, packet)

    def _accept(self, msg: Accepted, packet: Mapping[str, Any]) -> None:
        now = self._clock.monotonic()
        if self._dedup.is_duplicate(
            sender=msg.sender_num, packet_id=msg.packet_id, text=msg.text, now=now
        ):
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
            sender_name=self._sender_name(msg.sender_num),
        )
        try:
            self._inbound.put_nowait(inbound)
        except asyncio.QueueFull:
            log.warning("inbound queue full; dropping a message from %s", msg.sender)
            return
        log.info(
            "message from %s in %s (%d bytes, %d hops)",
            msg.sender,
            msg.space,
            utf8_len(msg.text),
            max(0, int(packet.get("hopStart", 0)) - int(packet.get("hopLimit", 0))),
        )

    def _tap(self, packet: Mapping[str, Any], *, addressed: bool) -> None:
        """Hand a channel text broadcast to the bridge (DMs and other ports never)."""
        decoded = packet.get("decoded")
        frm = packet.get("from")
        if (
            self.channel_listener is None
            or not isinstance(decoded, Mapping)
            or decoded.get("portnum") != "TEXT_MESSAGE_APP"
            or decoded.get("emoji")
            or packet.get("to") != BROADCAST_NUM
            or not isinstance(frm, int)
        ):
            return
        text = decoded.get("text")
        if not isinstance(text, str) or not text.strip():
            return
        hop_start = packet.get("hopStart")
        snr = packet.get("rxSnr")
        self.channel_listener(
            MeshText(
                sender=node_id(frm),
                short_name=self._short_name(frm),
                channel=int(packet.get("channel", 0)),
                packet_id=int(packet.get("id", 0)),
                text=text.strip(),
                addressed=addressed,
                own=frm == self._my_num,
                via_mqtt=bool(packet.get("viaMqtt")),
                hops=(
                    max(0, int(hop_start) - int(packet.get("hopLimit", 0)))
                    if isinstance(hop_start, int)
                    else None
                ),
                snr=float(snr) if isinstance(snr, int | float) else None,
            )
        )

    def _short_name(self, num: int) -> str | None:
        iface = self._iface
        try:
            user = (iface.nodesByNum or {}).get(num, {}).get("user", {}) if iface else {}
        except AttributeError:
            return None
        name = user.get("shortName") if isinstance(user, dict) else None
        return name if isinstance(name, str) and name.strip() else None

    # --- bridge: relayed text out -------------------------------------------------------------
    def fit_relay(self, text: str, *, max_parts: int) -> str:
        return fit(text, chunk_bytes=self._cfg.chunk_bytes, max_parts=max_parts)

    async def broadcast(self, channel: int, text: str, *, person: str, max_parts: int) -> Delivery:
        """Relayed text as numbered broadcast parts on ``channel``, through the paced outbox
        (behind and between the bot's answers, never around them)."""
        if self._loop is None or self._stopping:
            return Delivery(DeliveryStatus.FAILED, detail="the meshtastic transport is not running")
        parts = render_parts(
            split_parts(
                self.fit_relay(text, max_parts=max_parts),
                chunk_bytes=self._cfg.chunk_bytes,
                max_parts=max_parts,
            )
        )
        if not parts:
            return Delivery(DeliveryStatus.FAILED, detail="nothing to send")
        if len(self._jobs) >= self._cfg.outbox_limit:
            log.warning("outbox full (%d waiting); refusing relayed text", len(self._jobs))
            return Delivery(DeliveryStatus.FAILED, detail="outbox full")
        inbound = Inbound(transport=self.name, sender=person, text="", space=f"ch{channel}")
        job = _Job(
            reply=Reply(inbound=inbound, text=text, kind=ReplyKind.NOTICE),
            person=person,
            dest=BROADCAST_NUM,
            channel=channel,
            want_ack=False,
            parts=parts,
            enqueued_at=self._clock.monotonic(),
            future=asyncio.get_running_loop().create_future(),
        )
        self._jobs.append(job)
        self._jobs_changed.set()
        return await job.future

    def _sender_name(self, num: int) -> str | None:
        iface = self._iface
        try:
            user = (iface.nodesByNum or {}).get(num, {}).get("user", {}) if iface else {}
        except AttributeError:
            return None
        name = user.get("longName") if isinstance(user, dict) else None
        if not isinstance(name, str) or not name or name == f"Meshtastic {node_id(num)[-4:]}":
            return None  # the library's placeholder for a node that never sent its NodeInfo
        return name

    def _routing_in(self, packet: Mapping[str, Any], decoded: Mapping[str, Any]) -> None:
        request = decoded.get("requestId")
        if not isinstance(request, int):
            return
        routing = decoded.get("routing") or {}
        reason = routing.get("errorReason", "NONE") if isinstance(routing, Mapping) else "NONE"
        frm = packet.get("from")
        wait = self._acks.get(request)
        if wait is None:
            self._recent_routing[request] = (frm if isinstance(frm, int) else None, str(reason))
            while len(self._recent_routing) > 64:
                self._recent_routing.popitem(last=False)
            return
        self._apply_routing(wait, frm, str(reason))

    def _register_ack(self, pid: int, dest: int) -> _AckWait:
        wait = self._acks[pid] = _AckWait(dest=dest, sent_at=self._clock.monotonic())
        early = self._recent_routing.pop(pid, None)
        if early is not None:
            self._apply_routing(wait, *early)
        return wait

    @staticmethod
    def _apply_routing(wait: _AckWait, frm: object, reason: str) -> None:
        if reason != "NONE":
            wait.state, wait.reason = "nak", str(reason)
            wait.event.set()
        elif frm == wait.dest or wait.dest == BROADCAST_NUM:
            wait.state = "ack"
            wait.event.set()
        elif wait.state == "pending":
            wait.state = "relayed"  # implicit ACK: a neighbour rebroadcast it; keep waiting

    async def _inbound_loop(self) -> None:
        while True:
            inbound = await self._inbound.get()
            assert self._on_message is not None
            try:
                await self._on_message(inbound)
            except Exception:  # loop boundary: one bad message must not stop the radio
                log.exception("storing a message from %s failed", inbound.sender)
            finally:
                self._inbound.task_done()

    # --- the link ------------------------------------------------------------------------------
    def _link_down(self, reason: str) -> None:
        if self._up.is_set() and not self._lost.is_set():
            self._lost_reason = reason
            self._lost.set()

    async def _link_loop(self) -> None:
        backoff = Backoff(
            initial=self._cfg.reconnect_initial, maximum=self._cfg.reconnect_max, rng=self._rng
        )
        while not self._stopping:
            self._connecting = True
            self._early.clear()
            try:
                iface = await self._connect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # loop boundary: an absent radio is retried forever
                delay = backoff.next()
                log.warning(
                    "radio not reachable (%s: %s); retrying in %.0f s",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                self._connecting = False
                await self._clock.sleep(delay)
                continue
            self._connecting = False
            self._iface = iface
            try:
                self._my_num = int(iface.myInfo.my_node_num)
            except (AttributeError, TypeError, ValueError):
                log.warning("radio sent no node number; reconnecting")
                self._iface = None
                await self._close_interface(iface)
                await self._clock.sleep(backoff.next())
                continue
            self._channel_util = _channel_utilization(iface, self._my_num)
            self._last_rx = self._clock.monotonic()
            self._lost.clear()
            self._up.set()
            self._generation += 1
            self._announce_link_change()
            backoff.reset()
            log.info("connected to node %s (%s)", node_id(self._my_num), self._cfg.connection)
            early = list(self._early)
            self._early.clear()
            for packet, source in early:
                if source is iface:
                    self._packet_in(packet, source)
            await self._lost.wait()
            self._up.clear()
            self._iface = None
            self._announce_link_change()
            delay = backoff.next()
            log.warning("radio link down (%s); reconnecting in %.0f s", self._lost_reason, delay)
            await self._close_interface(iface)
            for wait in self._acks.values():
                wait.event.set()  # parts in flight are re-checked (and re-sent) after reconnect
            await self._clock.sleep(delay)

    async def _connect(self) -> RadioInterface:
        """Build an interface on the worker. One that finishes after we gave up waiting (or
        were stopped) is closed at once: a forgotten live link would keep a serial port locked
        (pyserial opens it exclusively) or a node's single API/BLE slot taken."""
        lock = threading.Lock()
        abandoned = False
        built: list[RadioInterface] = []

        def build() -> RadioInterface:
            iface = self._factory()
            with lock:
                if not abandoned:
                    built.append(iface)
                    return iface
            _close_quietly(iface)
            raise TransportError("the radio answered after the connect timeout; closed that link")

        try:
            return await self._call(build, timeout=self._cfg.connect_timeout + CONNECT_MARGIN)
        except BaseException:
            with lock:
                abandoned = True
            for iface in built:  # finished, but the result came back too late to be used
                await self._close_interface(iface)
            raise

    def _announce_link_change(self) -> None:
        event, self._link_changed = self._link_changed, asyncio.Event()
        event.set()

    def _link_ready(self, min_generation: int) -> bool:
        return (
            self._up.is_set()
            and not self._lost.is_set()
            and self._iface is not None
            and self._generation >= min_generation
        )

    async def _wait_link(self, min_generation: int, deadline: float) -> bool:
        """Wait until a link of at least ``min_generation`` is up, at most until ``deadline``."""
        while not self._link_ready(min_generation):
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0 or self._stopping:
                return False
            await self._wait(self._link_changed, remaining)
        return True

    async def _call(self, fn: Callable[[], T], *, timeout: float) -> T:
        """Run a blocking library call on the worker; a hung call abandons the worker."""
        try:
            return await self._worker.call(fn, timeout=timeout)
        except TimeoutError:
            log.warning("a radio call took over %.0f s; replacing the worker thread", timeout)
            self._worker.shutdown()
            self._worker = _Worker("meshtastic-io")
            raise

    async def _close_interface(self, iface: RadioInterface) -> None:
        """Close on a throwaway thread: close() joins reader threads and can raise or hang."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def run() -> None:
            try:
                _close_quietly(iface)
            finally:
                self._closing.release()
            _resolve(done, None, None)

        self._closing.acquire()
        threading.Thread(target=run, name="meshtastic-close", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(done), CLOSE_TIMEOUT)
        except TimeoutError:
            log.warning("closing the old interface hung; leaving it behind")

    def io_busy(self) -> bool:
        """A blocking library call is under way (tests' virtual clock waits for it)."""
        return self._worker.busy or self._closing.busy

    async def _watchdog(self) -> None:
        interval = max(1.0, self._cfg.stale_after / 4)
        while True:
            await self._clock.sleep(interval)
            if not self._up.is_set() or self._lost.is_set():
                continue
            if self._clock.monotonic() - self._last_rx < self._cfg.stale_after:
                continue
            if not await self._probe():
                self._link_down(f"no traffic for {self._cfg.stale_after:.0f} s and no probe answer")

    async def _probe(self) -> bool:
        """Ask our own node for its metadata; any packet back proves the link is alive."""
        iface, my_num = self._iface, self._my_num
        if iface is None or my_num is None:
            return False
        from meshtastic.protobuf import admin_pb2, portnums_pb2

        msg = admin_pb2.AdminMessage()
        msg.get_device_metadata_request = True
        self._traffic.clear()
        try:
            await self._call(
                lambda: iface.sendData(
                    msg,
                    destinationId=my_num,
                    portNum=portnums_pb2.PortNum.ADMIN_APP,
                    wantResponse=True,
                ),
                timeout=self._cfg.call_timeout,
            )
        except Exception as exc:  # any failure to write is a failed probe
            log.info("link probe failed to send: %s", exc)
            return False
        return await self._wait(self._traffic, self._cfg.probe_timeout)

    async def _wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Wait for ``event`` at most ``seconds`` on the injected clock."""
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (waiter, sleeper):
                t.cancel()
            await asyncio.gather(waiter, sleeper, return_exceptions=True)
        return event.is_set()

    # --- sending ------------------------------------------------------------------------------
    def _make_job(self, reply: Reply) -> _Job:
        inbound = reply.inbound
        sender = node_num(inbound.sender)
        text = self.fit(reply.text)
        parts = render_parts(
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

    async def _outbox_loop(self) -> None:
        while True:
            job = await self._next_job()
            try:
                delivery = await self._deliver(job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # loop boundary: a bug in one reply must not stop the outbox
                log.exception("sending a reply failed")
                delivery = Delivery(DeliveryStatus.FAILED, detail=f"internal error: {exc}")
            if job in self._jobs:
                self._jobs.remove(job)
            self._reply_cooldown.note(job.person, self._clock.monotonic())
            if not job.future.done():
                job.future.set_result(delivery)
            log.info(
                "reply to %s: %s (%d part(s))%s",
                job.person,
                delivery.status.value,
                len(job.parts),
                f" - {delivery.detail}" if delivery.detail else "",
            )

    async def _next_job(self) -> _Job:
        """The oldest reply whose person is out of cooldown (others wait their turn)."""
        while True:
            self._jobs_changed.clear()
            now = self._clock.monotonic()
            ready_at = float("inf")
            for job in self._jobs:
                at = self._reply_cooldown.ready_at(job.person)
                if at <= now:
                    return job
                ready_at = min(ready_at, at)
            if ready_at == float("inf"):
                await self._jobs_changed.wait()
            else:
                await self._wait(self._jobs_changed, ready_at - now)

    async def _deliver(self, job: _Job) -> Delivery:
        n = len(job.parts)
        ids: list[str] = []
        states: dict[int, str] = {}
        reasons: dict[int, str] = {}
        todo = list(range(n))
        deadline = job.enqueued_at + self._cfg.queue_wait
        for attempt in range(self._cfg.ack_retries + 1 if job.want_ack else 1):
            if attempt:
                delay = self._cfg.ack_backoff * 2 ** (attempt - 1)
                log.info(
                    "re-sending %d of %d part(s) to %s in %.0f s (attempt %d)",
                    len(todo),
                    n,
                    job.person,
                    delay,
                    attempt + 1,
                )
                await self._clock.sleep(delay)
            waits: dict[int, _AckWait] = {}
            for index in todo:
                pid = await self._transmit(job, index, deadline)
                if pid is None:
                    for wait_pid in [int(i) for i in ids]:
                        self._acks.pop(wait_pid, None)
                    return Delivery(
                        DeliveryStatus.FAILED,
                        message_ids=tuple(ids),
                        detail=f"no radio link for {self._cfg.queue_wait:.0f} s; "
                        f"part {index + 1} of {n} not sent",
                    )
                ids.append(str(pid))
                if job.want_ack:
                    waits[index] = self._register_ack(pid, job.dest)
            if not job.want_ack:
                return Delivery(DeliveryStatus.SENT, message_ids=tuple(ids))
            for index, wait in waits.items():
                remaining = wait.sent_at + self._cfg.ack_timeout - self._clock.monotonic()
                await self._wait(wait.event, remaining)
                states[index] = wait.state
                reasons[index] = wait.reason or "no ACK"
            for pid_text in ids[-len(waits) :]:
                self._acks.pop(int(pid_text), None)
            todo = [i for i in todo if states.get(i) in ("pending", "nak")]
            if not todo:
                break
        failed = [i for i in range(n) if states.get(i) in ("pending", "nak")]
        if failed:
            detail = "; ".join(f"part {i + 1}/{n}: {reasons[i]}" for i in failed)
            return Delivery(DeliveryStatus.FAILED, message_ids=tuple(ids), detail=detail)
        if all(states.get(i) == "ack" for i in range(n)):
            return Delivery(DeliveryStatus.DELIVERED, message_ids=tuple(ids))
        return Delivery(
            DeliveryStatus.SENT,
            message_ids=tuple(ids),
            detail="relayed by the mesh; the recipient did not confirm",
        )

    async def _transmit(self, job: _Job, index: int, deadline: float) -> int | None:
        """Put one part on air: wait for the link, a quiet channel and the spacing. A failed
        write takes the link down and the part is retried on the next link. None when no link
        came up before ``deadline``."""
        from meshtastic.protobuf import portnums_pb2

        text = job.parts[index]
        reply_id = _reply_id(job.reply) if index == 0 else None
        min_generation = 0
        while True:
            if not await self._wait_link(min_generation, deadline):
                return None
            await self._wait_for_quiet_channel()
            await self._pace()
            iface = self._iface
            if iface is None or not self._link_ready(min_generation):
                continue
            generation = self._generation

            def write(iface: RadioInterface = iface) -> Any:
                return iface.sendData(
                    text.encode("utf-8"),
                    destinationId=job.dest,
                    portNum=portnums_pb2.PortNum.TEXT_MESSAGE_APP,
                    wantAck=job.want_ack,
                    channelIndex=job.channel,
                    hopLimit=self._cfg.hop_limit,
                    replyId=reply_id,
                )

            try:
                packet = await self._call(write, timeout=self._cfg.call_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed write means a bad link: reconnect, then retry
                self._last_tx = self._clock.monotonic()
                log.warning("sending a part failed (%s: %s)", type(exc).__name__, exc)
                if self._generation == generation:
                    self._link_down(f"send failed: {type(exc).__name__}")
                min_generation = generation + 1
                continue
            self._last_tx = self._clock.monotonic()
            log.debug("sent part %d/%d to %s: %r", index + 1, len(job.parts), job.person, text)
            return int(packet.id)

    async def _pace(self) -> None:
        while True:
            remaining = self._cfg.spacing_seconds - (self._clock.monotonic() - self._last_tx)
            if remaining <= 0:
                return
            await self._clock.sleep(remaining)

    async def _wait_for_quiet_channel(self) -> None:
        util = self._channel_util
        if util is None or util <= self._cfg.busy_threshold:
            return
        log.info("channel busy (%.0f%% > %.0f%%); deferring", util, self._cfg.busy_threshold)
        waited = 0.0
        while waited < self._cfg.busy_max_wait:
            step = min(self._cfg.busy_poll, self._cfg.busy_max_wait - waited)
            await self._clock.sleep(step)
            waited += step
            util = self._channel_util
            if util is None or util <= self._cfg.busy_threshold:
                return
        log.warning("channel still busy after %.0f s; sending anyway", waited)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("meshtastic task ended unexpectedly", exc_info=task.exception())


def _sender(packet: Mapping[str, Any]) -> str:
    frm = packet.get("from")
    return node_id(frm) if isinstance(frm, int) else "?"


def _reply_id(reply: Reply) -> int | None:
    mid = reply.inbound.message_id
    try:
        return int(mid) if mid else None
    except ValueError:
        return None


def _close_quietly(iface: RadioInterface) -> None:
    """``close()`` that never raises (blocking: call it off the loop)."""
    try:
        _release_tx_queue(iface)
        iface.close()
    except Exception as exc:  # a dead port raises termios/serial errors on close
        log.debug("closing the old interface: %s", exc)


def _release_tx_queue(iface: RadioInterface) -> None:
    """Let a library interface we are closing stop waiting for TX-queue space.

    After the node reports a full queue (``QueueStatus.free == 0``) the library sleeps in a loop
    with no bound, both in ``sendData`` and in ``close()`` (which sends a disconnect through the
    same queue), so a wedged send would also wedge the close: the port stays open (serial is
    opened exclusively, so no new link could ever open it) and the thread never ends. Emptying
    ``queue`` first (nothing left there is written: an abandoned part is re-sent, paced, on the
    next link) and then forgetting the queue status lets both calls return.
    """
    pending = getattr(iface, "queue", None)
    if isinstance(pending, dict):
        pending.clear()
    if hasattr(iface, "queueStatus"):
        iface.queueStatus = None


def _channel_utilization(iface: RadioInterface, my_num: int) -> float | None:
    try:
        metrics = (iface.nodesByNum or {}).get(my_num, {}).get("deviceMetrics", {})
        value = metrics.get("channelUtilization")
        return float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None


# --- construction ------------------------------------------------------------------------------


def default_interface_factory(config: MeshtasticConfig) -> InterfaceFactory:
    """Build the library interface for ``config`` (runs on the worker thread)."""
    problem = config.link_problem()
    if problem:
        raise ConfigError(problem)
    timeout = int(config.connect_timeout)

    def serial() -> RadioInterface:
        from meshtastic.serial_interface import SerialInterface

        iface: RadioInterface = SerialInterface(devPath=config.device, timeout=timeout)
        return iface

    def tcp() -> RadioInterface:
        from meshtastic.tcp_interface import TCPInterface

        assert config.host is not None
        # The library connects without a timeout (an unreachable host blocks ~2 min): probe first.
        with socket.create_connection((config.host, config.port), timeout=min(10, timeout)):
            pass
        iface: RadioInterface = TCPInterface(config.host, portNumber=config.port, timeout=timeout)
        return iface

    def ble() -> RadioInterface:
        from meshtastic.ble_interface import BLEInterface

        # BLEInterface cleans up after itself only for BLEError; a node that connects but never
        # sends its config (MeshInterfaceError) would otherwise stay connected in BlueZ, and
        # every later attempt would fail. Keep a reference so the half-built object is closed.
        iface: RadioInterface = BLEInterface.__new__(BLEInterface)
        try:
            BLEInterface.__init__(iface, config.address, timeout=timeout)
        except BaseException:
            _close_quietly(iface)
            raise
        return iface

    return {"serial": serial, "tcp": tcp, "ble": ble}[config.connection]


def build_meshtastic(
    config: MeshtasticConfig,
    *,
    bot_name: str,
    command_prefix: str,
    interface_factory: InterfaceFactory | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> Transport:
    """The Meshtastic transport for ``config``; ``interface_factory``/``clock`` are for tests."""
    factory = interface_factory or default_interface_factory(config)
    return MeshtasticTransport(
        config=config,
        bot_name=bot_name,
        command_prefix=command_prefix,
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
