"""meshsage status --watch: the status view refreshed until Ctrl-C, the same lines as
``meshsage status``, following the bot through not running, healthy and a lost link."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from bot.cli import main
from bot.ops import watch as watch_mod
from bot.ops.status import STATUS_FILE, Status, TransportStatus, write_atomic
from bot.ops.watch import CLEAR, watch


def _status(link: str = "up", ok: bool = True) -> Status:
    return Status(
        written_at=time.time(), started_at=time.time() - 60, pid=os.getpid(), version="0.1.0",
        healthy=ok, transports={"meshtastic": TransportStatus(link=link, ok=ok)},
        problems=[] if ok else ["meshtastic: loop link died"],
    )  # fmt: skip


def test_each_frame_shows_the_file_as_it_is_now(tmp_path: Path) -> None:
    path = tmp_path / STATUS_FILE
    steps = iter([_status(), _status(link="down", ok=False)])
    out = io.StringIO()

    def sleep(seconds: float) -> None:
        assert seconds == 0.5
        write_atomic(path, next(steps).to_json())  # the bot writes between two frames

    assert watch(path, interval=0.5, out=out, tty=False, frames=3, sleep=sleep) == 0
    text = out.getvalue()
    first, second, third = text.split("Ctrl-C to stop")[:3]
    assert "the bot is not running" in first and "Fix:" in first
    assert "healthy" in second and "meshtastic: up" in second
    assert "NOT HEALTHY" in third and "meshtastic: down" in third and "loop link died" in third
    assert CLEAR not in text  # into a pipe: frames follow one another


def test_on_a_terminal_each_frame_clears_the_screen(tmp_path: Path) -> None:
    path = tmp_path / STATUS_FILE
    write_atomic(path, _status().to_json())
    out = io.StringIO()
    watch(path, interval=1, out=out, tty=True, frames=2, sleep=lambda s: None)
    assert out.getvalue().count(CLEAR) == 2


def test_the_command_runs_until_ctrl_c_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("MESHSAGE_STATE_DIR", str(state))
    write_atomic(state / STATUS_FILE, _status().to_json())
    waits: list[float] = []

    def ctrl_c(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(watch_mod, "_sleep", ctrl_c)
    assert main(["status", "--watch"]) == 0
    assert waits == [2.0, 2.0]  # the default interval
    assert capsys.readouterr().out.count("meshtastic: up") == 2
    with pytest.raises(SystemExit) as bad:
        main(["status", "--watch", "0"])
    assert bad.value.code == 2
