"""systemd notification over a real datagram socket: READY after the transports start,
WATCHDOG only while the event loop, the store and every transport loop are healthy, STATUS
lines, STOPPING at shutdown."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.app import App, build
from bot.memory.store import SqliteStore
from bot.ops.monitor import Monitor
from bot.ops.sdnotify import Notifier
from bot.ops.status import STATUS_FILE, read
from bot.transports.base import TransportHealth
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport


class Listener:
    """The systemd side: a bound datagram socket, recording (arrival time, message)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.got: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.got.append((time.monotonic(), data.decode()))

    def messages(self) -> list[str]:
        return [m for _, m in self.got]

    async def wait_for(self, prefix: str, *, after: int = 0, timeout: float = 60) -> int:
        """Index of the first message from ``after`` on that has a line starting ``prefix``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, (_, msg) in enumerate(self.got[after:], start=after):
                if any(line.startswith(prefix) for line in msg.splitlines()):
                    return i
            await asyncio.sleep(0.01)
        raise AssertionError(f"no {prefix!r} after #{after}: {self.messages()}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    sock = Listener(tmp_path / "notify.sock")
    yield sock
    sock.close()


class SickTransport(FakeTransport):
    """A FakeTransport whose loop can be declared wedged."""

    wedged = False

    def health(self) -> TransportHealth:
        if self.wedged:
            return TransportHealth(link="up", loop_ok=False, detail="reader loop wedged")
        return TransportHealth(link="up", outbox=2)


@pytest.fixture
async def served(
    tmp_path: Path, fake_llm: FakeLLM, listener: Listener
) -> AsyncIterator[tuple[App, SickTransport, asyncio.Event, asyncio.Task[bool]]]:
    config = make_config(tmp_path, fake_llm.base_url)
    transport = SickTransport(name="fake")
    # WatchdogSec=0.6: the monitor ticks every 0.2 s.
    env = {"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "600000"}
    app = await build(config, env=env, transports=[transport])
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    yield app, transport, stop, task
    stop.set()
    await asyncio.wait_for(task, 60)


async def test_ready_after_start_then_watchdog_then_stopping(
    served: tuple[App, SickTransport, asyncio.Event, asyncio.Task[bool]], listener: Listener
) -> None:
    app, _, stop, task = served
    ready = await listener.wait_for("READY=1")
    assert "STATUS=serving on fake" in listener.messages()[ready]
    assert app.monitor is not None and app.monitor.interval == pytest.approx(0.2)
    first = await listener.wait_for("WATCHDOG=1", after=ready)
    await listener.wait_for("WATCHDOG=1", after=first + 1)  # keeps pinging
    status = await listener.wait_for("STATUS=serving;")
    assert "fake up" in listener.messages()[status]
    report = read(app.config.database_path.parent / STATUS_FILE)
    assert report.healthy and report.transports["fake"].outbox == 2
    stop.set()
    assert await asyncio.wait_for(task, 60) is False  # asked to stop, not ended by itself
    stopping = await listener.wait_for("STOPPING=1")
    assert stopping > first
    assert not any("WATCHDOG" in m for m in listener.messages()[stopping:])


async def test_no_watchdog_while_a_transport_loop_is_wedged(
    served: tuple[App, SickTransport, asyncio.Event, asyncio.Task[bool]], listener: Listener
) -> None:
    app, transport, _, _ = served
    await listener.wait_for("WATCHDOG=1")
    transport.wedged = True
    bad = await listener.wait_for("STATUS=UNHEALTHY")
    assert "fake: reader loop wedged" in listener.messages()[bad]
    # Several more ticks pass (the status file is rewritten each tick) without a ping.
    path = app.config.database_path.parent / STATUS_FILE
    seen: set[float] = set()
    while len(seen) < 4:
        seen.add(read(path).written_at)
        await asyncio.sleep(0.05)
    assert not any("WATCHDOG" in m for m in listener.messages()[bad:])
    report = read(path)
    assert not report.healthy and report.problems == ["fake: reader loop wedged"]
    transport.wedged = False
    await listener.wait_for("WATCHDOG=1", after=bad)  # recovered: pings resume


async def test_no_watchdog_while_the_event_loop_is_blocked(
    served: tuple[App, SickTransport, asyncio.Event, asyncio.Task[bool]], listener: Listener
) -> None:
    await listener.wait_for("WATCHDOG=1")
    blocked_at = time.monotonic()
    time.sleep(1.5)  # a wedged event loop: a blocking call on the loop thread
    unblocked_at = time.monotonic()
    await listener.wait_for("WATCHDOG=1", after=len(listener.got))
    during = [
        t for t, m in listener.got if "WATCHDOG" in m and blocked_at + 0.05 < t < unblocked_at
    ]
    assert during == []


async def test_no_watchdog_while_the_store_is_wedged(
    tmp_path: Path, fake_llm: FakeLLM, listener: Listener
) -> None:
    config = make_config(tmp_path, fake_llm.base_url)
    app = await build(config, env={}, transports=[FakeTransport()])
    try:
        notifier = Notifier(env={"NOTIFY_SOCKET": str(listener.path)})
        monitor = Monitor(
            notifier=notifier, store=app.store, transports=lambda: app.transports,
            status_path=tmp_path / STATUS_FILE, latencies=app.latencies,
            last_error=app.last_error, store_timeout=0.2,
        )  # fmt: skip
        healthy = await monitor.tick()
        assert healthy.healthy
        await listener.wait_for("WATCHDOG=1")
        assert isinstance(app.store, SqliteStore)
        async with app.store._lock:  # a long write holds the store: the query cannot run
            sick = await monitor.tick()
        assert not sick.healthy
        assert sick.problems == ["the database did not answer within 0.2 s"]
        bad = await listener.wait_for("STATUS=UNHEALTHY")
        assert [m for m in listener.messages() if "WATCHDOG" in m] == ["WATCHDOG=1"]
        assert bad == len(listener.got) - 1
        notifier.close()
    finally:
        await app.close()


def test_abstract_socket_and_watchdog_pid(tmp_path: Path) -> None:
    name = f"meshsage-test-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    try:
        notifier = Notifier(env={"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "5000000"})
        assert notifier.watchdog_interval == 5.0
        assert notifier.ready("up")
        assert sock.recv(100) == b"READY=1\nSTATUS=up"
        notifier.close()
    finally:
        sock.close()
    other_pid = Notifier(env={"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "5", "WATCHDOG_PID": "1"})
    assert other_pid.watchdog_interval is None  # the pings are for another process
    silent = Notifier(env={})
    assert not silent.enabled and not silent.watchdog()
    broken = Notifier(env={"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert broken.notify("WATCHDOG=1") is False  # logged once, never raised
    broken.close()


async def test_meshsage_run_speaks_to_systemd_end_to_end(
    tmp_path: Path, fake_llm: FakeLLM, listener: Listener
) -> None:
    """The CLI as systemd starts it: a pinged start, READY, watchdog pings, STOPPING."""
    import os
    import signal
    import sys

    config = tmp_path / "config.yaml"
    config.write_text("meshtastic: {connection: tcp, host: 127.0.0.1, port: 9, "
                      "reconnect_initial: 30}\n")  # fmt: skip
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
        "MESHSAGE_CONFIG": str(config), "MESHSAGE_STATE_DIR": str(tmp_path / "state"),
        "MESHSAGE_LLM_BASE_URL": fake_llm.base_url,
        "NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "3000000",
    }  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        starting = await listener.wait_for("STATUS=starting")
        ready = await listener.wait_for("READY=1", after=starting)
        assert "STATUS=serving on meshtastic" in listener.messages()[ready]
        await listener.wait_for("WATCHDOG=1", after=ready)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    await listener.wait_for("STOPPING=1")
