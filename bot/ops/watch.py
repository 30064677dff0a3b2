"""``meshsage status --watch``: the status view refreshed in the terminal, for operators who
live in ssh.

Invariants:
- It reads the same status file and prints the same lines as ``meshsage status``
  (``bot.ops.status.read`` and ``render``), never anything else: the terminal, the web view's
  Now page and the one-shot command tell the same truth.
- A missing or unreadable file is shown (with the fix) and watched on: the bot may be starting
  or restarting. Ctrl-C ends it with status 0.
- On a terminal the screen is cleared before each frame (plain ANSI, no curses); into a pipe
  the frames follow one another, separated by a blank line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from bot.ops import status as status_file

CLEAR = "\033[H\033[2J"


def frame(path: Path, *, interval: float, now: float | None = None) -> list[str]:
    try:
        report = status_file.read(path)
    except FileNotFoundError:
        lines = [
            f"no status file at {path}: the bot is not running (or runs with another state "
            "dir). Fix: start it (sudo systemctl start meshsage) or pass its --config."
        ]
    except (OSError, ValueError) as exc:
        lines = [f"cannot read {path} ({exc})"]
    else:
        running = status_file.pid_running(report.pid)
        lines, _ok = status_file.render(report, now=now, running=running)
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    return [*lines, "", f"{stamp}, every {interval:g} s; Ctrl-C to stop"]


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def watch(
    path: Path,
    *,
    interval: float,
    out: TextIO,
    tty: bool,
    frames: int | None = None,
    sleep: Callable[[float], None] | None = None,
) -> int:
    pause = sleep or _sleep
    shown = 0
    try:
        while frames is None or shown < frames:
            text = "\n".join(frame(path, interval=interval))
            out.write((CLEAR if tty else ("\n" if shown else "")) + text + "\n")
            out.flush()
            shown += 1
            if frames is None or shown < frames:
                pause(interval)
    except KeyboardInterrupt:
        out.write("\n")
    return 0
