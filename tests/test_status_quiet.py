"""The status report costs an idle bot (almost) no writes (issue 43): rewritten when it changes
or at the heartbeat, kept in systemd's runtime directory (RAM) when there is one, and found
there by ``meshsage status`` and the container's HEALTHCHECK."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.app import build
from bot.ops import cli_ops
from bot.ops.monitor import STORE_TIMEOUT, Monitor
from bot.ops.sdnotify import Notifier
from bot.ops.status import (
    STALE_AFTER,
    STATUS_FILE,
    STATUS_HEARTBEAT,
    Status,
    find,
    read,
    report_path,
    write_atomic,
)
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

ROOT = Path(__file__).resolve().parents[1]


async def test_an_unchanged_report_is_written_at_the_heartbeat_only(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    config = make_config(tmp_path, fake_llm.base_url)
    app = await build(config, env={}, transports=[FakeTransport()])
    now = [1_000_000.0]
    path = tmp_path / STATUS_FILE
    try:
        monitor = Monitor(
            notifier=Notifier(env={}), store=app.store, transports=lambda: app.transports,
            status_path=path, latencies=app.latencies, last_error=app.last_error,
            clock=lambda: now[0],
        )  # fmt: skip
        await monitor.tick()
        assert read(path).written_at == now[0]
        first = now[0]
        for _ in range(5):  # five idle ticks, 5 s apart: nothing changed, nothing written
            now[0] += 5.0
            await monitor.tick()
        assert read(path).written_at == first
        now[0] = first + STATUS_HEARTBEAT  # the heartbeat: the report proves the bot alive
        await monitor.tick()
        assert read(path).written_at == now[0]
        beat = now[0]
        now[0] += 1.0
        app.latencies.add(2.5)  # a change is written at the next tick, heartbeat or not
        await monitor.tick()
        report = read(path)
        assert report.written_at == now[0] > beat and report.llm_calls == 1
        now[0] -= 3600.0  # the wall clock stepped back an hour (NTP): the heartbeat still beats
        await monitor.tick()
        now[0] += STATUS_HEARTBEAT
        await monitor.tick()
        assert read(path).written_at == now[0]
    finally:
        await app.close()


def test_the_heartbeat_keeps_the_report_fresh() -> None:
    # A heartbeat delayed by a tick that waited for a wedged store stays fresh for `status`.
    assert STATUS_HEARTBEAT + STORE_TIMEOUT < STALE_AFTER


def test_report_path_is_the_runtime_directory_when_systemd_gives_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert report_path(state, {}) == state / STATUS_FILE
    run = tmp_path / "run"
    assert report_path(state, {"RUNTIME_DIRECTORY": str(run)}) == run / STATUS_FILE
    two = f"{run}:{tmp_path / 'other'}"  # RuntimeDirectory= with two names
    assert report_path(state, {"RUNTIME_DIRECTORY": two}) == run / STATUS_FILE


def test_status_finds_the_report_where_the_service_keeps_it(tmp_path: Path) -> None:
    state, unit_run, run = tmp_path / "state", tmp_path / "run-meshsage", tmp_path / "rt"
    for d in (state, unit_run, run):
        d.mkdir()
    env = {"RUNTIME_DIRECTORY": str(run)}
    assert find(state, {}, systemd_dir=unit_run) == state / STATUS_FILE  # none yet: where
    (state / STATUS_FILE).write_text("{}")  # an old report left by a killed bot
    assert find(state, {}, systemd_dir=unit_run) == state / STATUS_FILE
    (unit_run / STATUS_FILE).write_text("{}")  # the service's (an operator's shell)
    assert find(state, {}, systemd_dir=unit_run) == unit_run / STATUS_FILE
    (run / STATUS_FILE).write_text("{}")  # the bot's own environment (the HEALTHCHECK)
    assert find(state, env, systemd_dir=unit_run) == run / STATUS_FILE


async def test_the_bot_writes_its_report_in_the_runtime_directory(
    tmp_path: Path, fake_llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path, fake_llm.base_url)
    run = tmp_path / "run" / "meshsage"
    env = {"RUNTIME_DIRECTORY": str(run)}
    app = await build(config, env=env, transports=[FakeTransport()])
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        for _ in range(3000):
            if (run / STATUS_FILE).exists():
                break
            await asyncio.sleep(0.02)
        assert read(run / STATUS_FILE).pid == os.getpid()
        assert not (config.database_path.parent / STATUS_FILE).exists()  # off the SD card
        assert oct((run / STATUS_FILE).stat().st_mode & 0o777) == "0o600"
        assert cli_ops.status(config, as_json=False, env=env) == 0
        assert "healthy" in capsys.readouterr().out
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    assert not (run / STATUS_FILE).exists()  # removed at a clean stop


def test_status_command_reads_the_runtime_directory(tmp_path: Path) -> None:
    """`meshsage status` as the HEALTHCHECK runs it: only the environment says where."""
    run = tmp_path / "shm"
    run.mkdir()
    now = time.time()
    write_atomic(run / STATUS_FILE, Status(written_at=now, started_at=now - 5, pid=1,
                                           version="t", healthy=True).to_json())  # fmt: skip
    env = {
        "PATH": os.environ.get("PATH", ""),
        "MESHSAGE_STATE_DIR": str(tmp_path / "state"),
        "RUNTIME_DIRECTORY": str(run),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "status"], env=env, capture_output=True, text=True,
        timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "pid 1): healthy" in done.stdout


def test_the_service_and_the_image_keep_the_report_in_ram() -> None:
    unit = (ROOT / "systemd" / "meshsage.service").read_text(encoding="utf-8")
    assert "\nRuntimeDirectory=meshsage\n" in unit
    docker = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "RUNTIME_DIRECTORY=/dev/shm/meshsage" in docker  # a tmpfs in every container


def test_a_bot_started_by_hand_keeps_its_report_in_the_session_runtime_dir(
    tmp_path: Path,
) -> None:
    """A login session's $XDG_RUNTIME_DIR is a tmpfs: a bot started by hand writes its
    heartbeat there, not on the SD card; systemd's RuntimeDirectory= still wins."""
    state, session = tmp_path / "state", tmp_path / "user-1000"
    session.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(session)}
    assert report_path(state, env) == session / "meshsage" / STATUS_FILE
    run = tmp_path / "run"
    assert report_path(state, {**env, "RUNTIME_DIRECTORY": str(run)}) == run / STATUS_FILE
    # not a usable directory: the state dir, as before
    assert report_path(state, {"XDG_RUNTIME_DIR": str(tmp_path / "missing")}) == (
        state / STATUS_FILE
    )
    assert report_path(state, {"XDG_RUNTIME_DIR": "relative/dir"}) == state / STATUS_FILE


def test_status_reads_the_newest_report_wherever_it_is(tmp_path: Path) -> None:
    state, session, unit_run = tmp_path / "state", tmp_path / "user", tmp_path / "unit"
    for d in (state, session / "meshsage", unit_run):
        d.mkdir(parents=True)
    env = {"XDG_RUNTIME_DIR": str(session)}
    old = unit_run / STATUS_FILE  # a service that ran last week
    old.write_text("{}")
    os.utime(old, (1_000_000, 1_000_000))
    mine = session / "meshsage" / STATUS_FILE  # the bot started by hand now
    mine.write_text("{}")
    assert find(state, env, systemd_dir=unit_run) == mine
    os.utime(mine, (900_000, 900_000))  # or the other way round
    assert find(state, env, systemd_dir=unit_run) == old
