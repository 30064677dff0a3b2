"""Runs the real Meshtastic transport against the fake radio on a virtual clock.

``mesh_harness`` wires: FakeClock -> FakeTcpRadio/FakePtyRadio (stamps packets on that clock)
-> the unmodified TCPInterface/SerialInterface (built by an injected factory) -> the transport.
On exit it stops everything and checks the on-air invariants (``fake_radio.check_on_air``):
each text packet is at most 200 UTF-8 bytes, and consecutive text packets are at least the
configured ``spacing_seconds`` apart on the radio's clock, across reconnects. (The suite-wide
guard in ``tests/conftest.py`` checks every other fake radio too.) While it runs, the radio sends
its device metrics every ``radio.metrics_every`` seconds of the fake clock, as the firmware does
(``metrics_every=None``: only at connect and after each text, for tests whose virtual time must
not move while nothing else sleeps).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import inspect
import random
import select
import termios
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from meshtastic import publishingThread
from meshtastic.serial_interface import SerialInterface
from meshtastic.tcp_interface import TCPInterface

from bot.config import MeshtasticConfig
from bot.domain import Delivery, Inbound, Reply
from bot.transports.meshtastic import MeshtasticTransport, build_meshtastic
from tests.fakes.fake_clock import FakeClock
from tests.fakes.fake_radio import FakePtyRadio, FakeTcpRadio, Later, check_on_air

FAST = {  # small values so failure paths finish quickly in virtual time
    "reconnect_initial": 5.0,
    "reconnect_max": 300.0,
    "connect_timeout": 10.0,
    "call_timeout": 5.0,
    "stale_after": 0.0,
    "ack_timeout": 45.0,
    "ack_backoff": 10.0,
    "cooldown": 0.0,
    "channel_cooldown": 0.0,
}


def library_busy(interfaces: list[Any]) -> bool:
    """Wait until the library has read and published what the radio wrote. True if it waited."""
    waited = False
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        busy = not publishingThread.queue.empty()
        for iface in interfaces[-1:]:
            sock = getattr(iface, "socket", None)
            stream = getattr(iface, "stream", None)
            try:
                if sock is not None and (select.select([sock], [], [], 0)[0] or _unsent(sock) > 0):
                    busy = True
                if stream is not None and stream.in_waiting:
                    busy = True
            except (OSError, ValueError, TypeError):
                pass
        if not busy:
            return waited
        waited = True
        time.sleep(0.001)
    return waited


def _unsent(sock: Any) -> int:
    """Bytes the library wrote that the kernel has not delivered yet (Nagle can hold them)."""
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf)
    return buf[0]


@dataclass
class Harness:
    radio: FakeTcpRadio | FakePtyRadio
    clock: FakeClock
    transport: MeshtasticTransport
    config: MeshtasticConfig
    interfaces: list[Any]
    attempts: list[float]  # clock time of every connect attempt (the interface factory's calls)
    inbox: list[Inbound] = field(default_factory=list)

    async def until(self, cond: Callable[[], bool], what: str = "condition") -> None:
        """Poll (a hang guard, not a timing assertion) until ``cond`` holds."""
        for _ in range(1000):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"gave up waiting for {what}")

    async def connected(self, count: int = 1) -> None:
        await self.until(
            lambda: self.transport._up.is_set() and self.transport._generation >= count,
            f"link generation {count}",
        )

    async def server_gone(self) -> None:
        """The TCP node disappears (reboot, WiFi outage); returns once the transport noticed."""
        self.tcp.stop()
        await self.until(lambda: not self.transport._up.is_set(), "link down")

    async def message(self, n: int = 1) -> Inbound:
        await self.until(lambda: len(self.inbox) >= n, f"{n} inbound message(s)")
        return self.inbox[n - 1]

    @property
    def tcp(self) -> FakeTcpRadio:
        assert isinstance(self.radio, FakeTcpRadio)
        return self.radio

    @property
    def pty(self) -> FakePtyRadio:
        assert isinstance(self.radio, FakePtyRadio)
        return self.radio

    async def reply(self, inbound: Inbound, text: str) -> Delivery:
        return await self.transport.send(Reply(inbound=inbound, text=self.transport.fit(text)))


@contextlib.asynccontextmanager
async def mesh_harness(
    *,
    serial: bool = False,
    start_radio: bool = True,
    start: bool = True,
    after_connect: Callable[[int], None] | None = None,
    metrics: bool = True,
    metrics_every: float | None = None,
    known: tuple[int, ...] = (),
    command_names: tuple[str, ...] = (),
    **overrides: Any,
) -> AsyncIterator[Harness]:
    """``start=False``: the transport is built but not started (a test hands it to the app,
    whose responder then receives the messages instead of ``Harness.inbox``).
    ``after_connect(n)`` runs on the worker thread once connect attempt ``n`` (from 0) has built
    its interface, before the transport gets it (a slow handshake). ``metrics=False``: a radio
    without device metrics (old firmware; the transport paces by spacing alone).
    ``metrics_every``: the radio reports its device metrics on the fake clock this often (60:
    the firmware), besides after each text it sends. ``known``: more nodes in the radio's node
    DB (their NodeInfo announced, as real radios do), besides Alice and Bob."""
    clock = FakeClock()
    radio: FakeTcpRadio | FakePtyRadio = (
        FakePtyRadio(clock=clock) if serial else FakeTcpRadio(clock=clock)
    )
    if not start_radio and isinstance(radio, FakeTcpRadio):
        radio.stop()
    settings: dict[str, Any] = {**FAST, **overrides}
    if isinstance(radio, FakePtyRadio):
        settings.update(connection="serial", device=radio.path)
    else:
        settings.update(connection="tcp", host="127.0.0.1", port=radio.port)
    config = MeshtasticConfig.model_validate(settings)
    radio.min_spacing = config.spacing_seconds
    radio.nodes.update({num: (f"Node {num:08x}", f"{num & 0xFFFF:04x}") for num in known})
    radio.metrics = metrics
    interfaces: list[Any] = []
    attempts: list[float] = []

    def factory() -> Any:
        attempts.append(clock.monotonic())
        if isinstance(radio, FakePtyRadio):
            iface: Any = SerialInterface(devPath=radio.path, timeout=5)
        else:
            iface = TCPInterface("127.0.0.1", portNumber=radio.port, timeout=5)
        interfaces.append(iface)
        if after_connect is not None:
            after_connect(len(attempts) - 1)
        return iface

    transport = build_meshtastic(
        config,
        bot_name="meshsage",
        command_prefix="!",
        command_names=command_names,  # the app's: known commands trigger on a channel
        interface_factory=factory,
        clock=clock,
        rng=random.Random(7),
    )
    assert isinstance(transport, MeshtasticTransport)

    wedged: list[str] = []

    def io_busy() -> bool:
        waited = False
        end = time.monotonic() + 10.0
        while transport.io_busy() and not wedged:  # a connect, send or close under way
            if time.monotonic() > end:  # never returns: fail the test (below), stop waiting
                wedged.append("a blocking library call (connect/send/close) never returned")
                break
            waited = True
            time.sleep(0.002)
        return waited

    timers: set[asyncio.Task[None]] = set()

    async def answer_later(pid: int, dest: int, later: Later) -> None:
        await clock.sleep(later.delay)
        radio.inject_routing(pid, later.answer, frm=later.frm if later.frm is not None else dest)

    def schedule_routing() -> bool:
        """Delayed routing answers become sleepers on the fake clock (so time stops there)."""
        with radio._lock:
            due, radio.scheduled[:] = list(radio.scheduled), []
        for pid, dest, later in due:
            task = asyncio.get_running_loop().create_task(answer_later(pid, dest, later))
            timers.add(task)
            task.add_done_callback(timers.discard)
        return bool(due)

    clock.settle_hooks += [
        io_busy,
        radio.settle,
        lambda: library_busy(interfaces),
        schedule_routing,
    ]
    harness = Harness(radio, clock, transport, config, interfaces, attempts)

    async def report_metrics() -> None:  # the firmware's periodic device-metrics telemetry
        assert metrics_every is not None
        radio.metrics_every = metrics_every
        while True:
            await clock.sleep(radio.metrics_every)
            radio.report_metrics()

    if metrics_every is not None:
        reporter = asyncio.get_running_loop().create_task(report_metrics())
        timers.add(reporter)
        reporter.add_done_callback(timers.discard)

    async def on_message(inbound: Inbound) -> None:
        harness.inbox.append(inbound)

    try:
        if start:
            await transport.start(on_message)
            if start_radio:
                await harness.connected()
        yield harness
    finally:
        await transport.stop()
        for task in list(timers):
            task.cancel()
        await clock.close()
        if isinstance(radio, FakeTcpRadio):
            radio.stop()
        else:
            radio.unplug()
        check_on_air(radio, spacing=config.spacing_seconds)  # across reconnects too
        assert not wedged, wedged[0]


@contextlib.asynccontextmanager
async def every(
    clock: FakeClock, seconds: float, step: Callable[[], Awaitable[object]]
) -> AsyncIterator[None]:
    """Run ``step`` every ``seconds`` of the fake clock while the block runs: the app's outbox
    round (``responder.redeliver``, every 10 s of real time in the app) on virtual time."""

    async def loop() -> None:
        while True:
            await clock.sleep(seconds)
            await step()

    task = asyncio.get_running_loop().create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def hold_clock_while_busy(h: Harness, app: Any) -> None:
    """Virtual time must not move while the app does real work: a store call, an LLM call, a
    received message not yet handed to the responder. On a loaded machine those take real
    milliseconds, and the fake clock would otherwise jump to its next sleeper (an outbox round,
    a metrics report) meanwhile, which inflates every latency measured on it."""
    inflight = [0]

    def wrap(obj: Any, name: str) -> None:
        original = getattr(obj, name)

        async def counted(*args: Any, **kw: Any) -> Any:
            inflight[0] += 1
            try:
                return await original(*args, **kw)
            finally:
                inflight[0] -= 1

        setattr(obj, name, counted)

    store = app.store
    for name in dir(type(store)):
        if not name.startswith("_") and inspect.iscoroutinefunction(getattr(type(store), name)):
            wrap(store, name)
    wrap(app.responder.parts.llm, "complete")
    h.clock.settle_hooks.append(lambda: inflight[0] > 0 or h.transport._inbound.qsize() > 0)
