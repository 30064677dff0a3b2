"""A status that never calls a dead bot healthy, and views and rotations that survive a clock
stepped back (issue 38): a report dated in the future or whose pid is not running fails
``meshsage status`` (exit 1); the web view's hour chart keeps drawing after the clock went
back a day; backup rotation keeps the newest backups when the clock was 30 days behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bot.cli import main
from bot.memory.store import SqliteStore
from bot.ops.backup import ORDER_FILE, newest_first
from bot.ops.status import STATUS_FILE, Status, write_atomic
from bot.web.history import History
from bot.web.model import newest_backup
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_sync import SteppedWall
from tests.web_harness import web_app

DAY = 86_400.0


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    monkeypatch.setenv("MESHSAGE_STATE_DIR", str(path))
    return path


def _dead_pid() -> int:
    """The pid of a process that has ended (reaped: nothing runs under it now)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _report(*, written_at: float, pid: int) -> str:
    return Status(
        written_at=written_at, started_at=written_at - 600, pid=pid, version="0.1.0",
        healthy=True,
    ).to_json()  # fmt: skip


def test_a_dead_bots_report_dated_an_hour_ahead_is_not_healthy(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: "(pid 999999): healthy / report: written -3591 s ago", exit 0 (the Pi rebooted
    with its clock behind the dead bot's last report)."""
    write_atomic(state / STATUS_FILE, _report(written_at=time.time() + 3600, pid=_dead_pid()))
    assert main(["status"]) == 1
    out = capsys.readouterr().out
    assert "NOT HEALTHY" in out
    assert "in the future" in out and "written -" not in out
    assert "is not running" in out


def test_a_report_from_the_future_is_not_healthy_even_with_a_live_pid(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_atomic(state / STATUS_FILE, _report(written_at=time.time() + 3600, pid=os.getpid()))
    assert main(["status"]) == 1
    assert "NOT HEALTHY" in capsys.readouterr().out


def test_a_fresh_report_whose_pid_is_gone_is_not_healthy(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed with -9 a moment ago: its report is still fresh, its process is not."""
    write_atomic(state / STATUS_FILE, _report(written_at=time.time(), pid=_dead_pid()))
    assert main(["status"]) == 1
    out = capsys.readouterr().out
    assert "NOT HEALTHY" in out and "is not running" in out and "systemctl restart" in out
    write_atomic(state / STATUS_FILE, _report(written_at=time.time(), pid=os.getpid()))
    assert main(["status"]) == 0  # the same report from a live process is healthy


async def test_the_hour_chart_draws_again_after_the_clock_went_back_a_day(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Before: after -1 day every sample went into the last bucket from before the step and
    the hour chart drew 0 of 60 buckets. Samples from the real app's web view, one a minute."""
    async with web_app(tmp_path, fake_llm, None) as app:
        assert app.web is not None
        snap = await app.web.sample()
    history = History()
    t0 = snap.at
    for i in range(30):
        history.add(replace(snap, at=t0 + 60 * i))
    back = t0 + 30 * 60 - DAY  # the clock steps back a day
    for i in range(60):
        history.add(replace(snap, at=back + 60 * i))
    now = back + 59 * 60
    assert sum(b is not None for b in history.hour.series(now)) == 60
    assert sum(b is not None for b in history.day.series(now)) >= 4
    ahead = now + DAY  # and forward again: a gap, then it fills
    for i in range(60):
        history.add(replace(snap, at=ahead + 60 * i))
    assert sum(b is not None for b in history.hour.series(ahead + 59 * 60)) == 60


async def test_backups_made_while_the_clock_was_30_days_behind_are_kept_as_the_newest(
    tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six daily backups on a right clock, then three on a clock 30 days behind (keep 7).
    Before: each run deleted the previous wrong-clock backup ("newest" by the name's date):
    1 current backup left beside 6 stale ones."""
    store = await SqliteStore.open(state / "meshsage.db")
    await store.close()
    wall = SteppedWall()
    monkeypatch.setattr(time, "time", wall)
    monkeypatch.setattr(time, "strftime", wall.strftime)
    target = tmp_path / "backups"
    made = []
    for _ in range(6):
        assert main(["backup", f"{target}/", "--keep", "7"]) == 0
        made.append(newest_first(target)[0].name)
        wall.step(DAY)
    wall.step(-30 * DAY)  # the Pi rebooted with its clock a month behind
    for _ in range(3):
        assert main(["backup", f"{target}/", "--keep", "7"]) == 0
        made.append(newest_first(target)[0].name)
        wall.step(DAY)
    left = sorted(p.name for p in target.glob("meshsage-*.db"))
    assert len(set(made)) == 9
    assert left == sorted(made[-7:])  # the 7 written last, whatever their names say
    assert [p.name for p in newest_first(target)][:3] == made[-1:-4:-1]
    assert (target / ORDER_FILE).read_text().split() == made[-7:]
    last = newest_backup(target)  # what the web view shows as the last backup
    assert last is not None and last[0] == made[-1]
