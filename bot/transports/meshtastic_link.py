"""The Meshtastic link: one local radio through the unmodified library, kept up forever.

Owns the library interface, the worker thread every blocking call runs on, the pubsub
listeners, reconnects and the stale-link watchdog. ``MeshtasticTransport`` (``meshtastic.py``)
mixes it in together with the outbox (``meshtastic_outbox.py``); only ``meshtastic*.py`` modules
import ``meshtastic``/``pubsub``.

Invariants:
- Threads: the library calls our pubsub listeners on its "publishing" thread; they only hand
  packets to the event loop (``call_soon_threadsafe``). pypubsub holds weak references, so the
  listeners are bound methods of the transport, which the app keeps alive; ``stop``
  unsubscribes.
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
- The link is rebuilt forever with exponential backoff and jitter (``reconnect_initial``
  doubling to ``reconnect_max``) after connection.lost, a timed-out call, or a stale link
  (quiet for ``stale_after`` and a failed probe; a node seen sending its device metrics on
  this link at a regular interval is expected to keep doing so: quiet for three of its
  intervals, at least ``REPORTS_QUIET_MIN``, and it is probed then, so a wedged node that keeps
  its link open is found in minutes, not after ``stale_after``); the old interface is closed
  defensively
  off-loop. A radio that is absent at startup is retried the same way; ``start`` does not wait
  for it. ``_generation`` counts successful connects; ``_link_changed`` fires on every change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from bot.config import MeshtasticConfig
from bot.errors import ConfigError, TransportError
from bot.transports.mesh_airtime import Metrics
from bot.transports.mesh_rules import Backoff, Clock, node_id
from bot.transports.meshtastic_ble import ble_failure, interface_class

log = logging.getLogger("bot.transport.meshtastic")

T = TypeVar("T")

TOPIC_RECEIVE = "meshtastic.receive"  # parent topic: every packet (text, routing, admin, ...)
TOPIC_LOST = "meshtastic.connection.lost"
EARLY_LIMIT = 64  # packets that arrive while an interface is still being built
CLOSE_TIMEOUT = 10.0
# The library's own waits on top of connect_timeout (a hard-coded 30 s for the first answer).
CONNECT_MARGIN = 45.0
REPORTS_QUIET_MIN = 120.0  # a reporting node quiet this long (or 3 intervals) gets probed


class RadioInterface(Protocol):
    """The part of ``meshtastic.mesh_interface.MeshInterface`` this transport uses."""

    myInfo: Any
    nodesByNum: Any

    def sendData(self, data: Any, *args: Any, **kwargs: Any) -> Any: ...

    # The library's own send path: it keeps a MeshPacket's nonzero ``id`` (it picks one only
    # for ``id == 0``), which is how a part goes out with the packet id planned for it.
    def _sendPacket(self, meshPacket: Any, *args: Any, **kwargs: Any) -> Any: ...

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


class MeshLink:
    """The link half of ``MeshtasticTransport`` (state is set up in its ``__init__``)."""

    _cfg: MeshtasticConfig
    _factory: InterfaceFactory
    _clock: Clock
    _rng: random.Random
    _worker: _Worker
    _loop: asyncio.AbstractEventLoop | None
    _iface: RadioInterface | None
    _my_num: int | None
    _connecting: bool
    _early: deque[tuple[dict[str, Any], object]]
    _up: asyncio.Event
    _lost: asyncio.Event
    _lost_reason: str
    _generation: int
    _link_changed: asyncio.Event
    _stopping: bool
    _last_rx: float
    _traffic: asyncio.Event
    _subscribed: bool
    _closing: _Counter
    _reports: deque[float]  # when this link's node sent its last device-metrics reports

    def _packet_in(self, packet: dict[str, Any], interface: object) -> None:
        raise NotImplementedError

    def _metrics_at_connect(self, metrics: Metrics) -> None:
        raise NotImplementedError

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

    def _lost_in(self, interface: object) -> None:
        if interface is self._iface and self._iface is not None:
            self._link_down("connection lost")

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
            self._metrics_at_connect(_device_metrics(iface, self._my_num))
            self._reports.clear()
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

    def _report_seen(self) -> None:
        """The node sent its device metrics (the firmware does so every minute)."""
        self._reports.append(self._clock.monotonic())

    def _quiet_limit(self) -> float:
        """How long the node may stay silent before it is probed (see the module docstring)."""
        limit = self._cfg.stale_after
        if len(self._reports) >= 2:
            gaps = [b - a for a, b in zip(self._reports, list(self._reports)[1:], strict=False)]
            limit = min(limit, max(REPORTS_QUIET_MIN, 3 * max(gaps)))
        return limit

    async def _watchdog(self) -> None:
        interval = max(1.0, min(self._cfg.stale_after, REPORTS_QUIET_MIN) / 4)
        while True:
            await self._clock.sleep(interval)
            if not self._up.is_set() or self._lost.is_set():
                continue
            quiet = self._quiet_limit()
            if self._clock.monotonic() - self._last_rx < quiet:
                continue
            if not await self._probe():
                self._link_down(f"no traffic for {quiet:.0f} s and no probe answer")

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


def _device_metrics(iface: RadioInterface, my_num: int) -> Metrics:
    """The local node's device metrics as the library keeps them (``nodesByNum``)."""
    try:
        metrics = (iface.nodesByNum or {}).get(my_num, {}).get("deviceMetrics", {})
        return metrics_from(metrics)
    except (AttributeError, TypeError, ValueError):
        return Metrics()


def metrics_from(metrics: Any) -> Metrics:
    """``Metrics`` from the library's ``deviceMetrics`` dict. The library drops fields that
    are zero (protobuf to dict), so in a non-empty dict a missing figure is 0; no dict at all
    (or an empty one) means the radio reports no device metrics (None)."""
    if not isinstance(metrics, dict) or not metrics:
        return Metrics()
    util, tx = metrics.get("channelUtilization", 0.0), metrics.get("airUtilTx", 0.0)
    return Metrics(
        channel_utilization=float(util) if isinstance(util, int | float) else None,
        air_util_tx=float(tx) if isinstance(tx, int | float) else None,
    )


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
        BLEInterface = interface_class()  # the library's, closing off its own loop

        # BLEInterface cleans up after itself only for BLEError; a node that connects but never
        # sends its config (MeshInterfaceError) would otherwise stay connected in BlueZ, and
        # every later attempt would fail. Keep a reference so the half-built object is closed.
        iface: RadioInterface = BLEInterface.__new__(BLEInterface)
        try:
            BLEInterface.__init__(iface, config.address, timeout=timeout)
        except BaseException as exc:
            _close_quietly(iface)
            if isinstance(exc, Exception):  # the cause and the fix, in the log line
                raise TransportError(ble_failure(exc, config.address)) from exc
            raise
        return iface

    return {"serial": serial, "tcp": tcp, "ble": ble}[config.connection]
