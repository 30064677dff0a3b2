"""meshsage status: reads the status file the running bot rewrites; exit 0 only when the report
is fresh and healthy (the container HEALTHCHECK relies on that)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bot.cli import main
from bot.ops.metrics import Latencies
from bot.ops.status import STALE_AFTER, STATUS_FILE, Status, TransportStatus, read, write_atomic
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM


def _status(**kw: object) -> Status:
    base: dict[str, object] = dict(
        written_at=time.time(), started_at=time.time() - 3700, pid=os.getpid(), version="0.1.0",
        healthy=True, transports={"meshtastic": TransportStatus(link="up", ok=True, outbox=1)},
        messages_in_today=5, messages_out_today=4, llm_calls=9, llm_p50_seconds=1.5,
        llm_p95_seconds=4.25, database_bytes=2_500_000,
    )  # fmt: skip
    base.update(kw)
    return Status(**base)  # type: ignore[arg-type]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    monkeypatch.setenv("MESHSAGE_STATE_DIR", str(path))
    return path


def test_no_status_file_means_not_running(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 1
    assert "the bot is not running" in capsys.readouterr().err


def test_fresh_healthy_report(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_atomic(state / STATUS_FILE, _status().to_json())
    assert main(["status", "-v"]) == 0
    out = capsys.readouterr().out
    assert "healthy" in out and "uptime:     1h 1m" in out
    assert "meshtastic: up, outbox 1" in out
    assert "today:      5 in, 4 out" in out
    assert "p50 1.5 s, p95 4.2 s over the last 9 call(s)" in out
    assert "database:   2.5 MB" in out
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pid"] == os.getpid()


def test_stale_or_unhealthy_report_fails(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_atomic(state / STATUS_FILE, _status(written_at=time.time() - STALE_AFTER - 5).to_json())
    assert main(["status"]) == 1
    assert "stale" in capsys.readouterr().out
    sick = _status(
        healthy=False,
        problems=["meshtastic: loop outbox died"],
        last_error_at=time.time(),
        last_error="bot.transport.meshtastic: boom",
    )
    write_atomic(state / STATUS_FILE, sick.to_json())
    assert main(["status"]) == 1
    out = capsys.readouterr().out
    assert "NOT HEALTHY" in out and "problem:    meshtastic: loop outbox died" in out
    assert "last error:" in out and "boom" in out


def test_garbage_status_file(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (state / STATUS_FILE).write_text("{half a file")
    assert main(["status"]) == 1
    assert "not a meshsage status file" in capsys.readouterr().err


async def test_the_running_bot_reports_counts_latency_and_errors(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.say("hello")
        await h.say("again")
        import logging

        logging.getLogger("bot.test").error("disk full while writing exports")
        monitor = h.app.monitor
        assert monitor is not None
        await monitor.tick()
        report = read(tmp_path / "state" / STATUS_FILE)
    finally:
        await h.app.close()
    assert report.healthy and report.messages_in_today == 2 and report.messages_out_today == 2
    assert report.llm_calls >= 2 and report.llm_p50_seconds is not None
    assert report.last_error == "bot.test: disk full while writing exports"
    assert report.database_bytes > 0
    assert "hello" not in json.dumps(report.to_json())  # counts only, never text
    assert not (tmp_path / "state" / STATUS_FILE).exists()  # removed at a clean stop


def test_percentiles_use_the_nearest_rank() -> None:
    lat = Latencies(window=100)
    assert lat.percentile(50) is None
    for s in range(1, 101):
        lat.add(float(s))
    assert lat.percentile(50) == 50.0 and lat.percentile(95) == 95.0
    lat.add(1000.0)  # the oldest value leaves the window
    assert len(lat) == 100 and lat.percentile(100) == 1000.0
