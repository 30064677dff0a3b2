"""A system clock state for ``bot.clock.ClockWatch`` (the real one runs ``timedatectl``), and a
wall clock tests step the way NTP steps a Raspberry Pi's."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bot.clock import Sync


@dataclass
class FakeSync:
    """What the system says: ``synchronized`` None means it does not say (no systemd)."""

    synchronized: bool | None = None
    ntp_active: bool | None = None
    reads: int = 0

    def read(self) -> Sync:
        self.reads += 1
        return Sync(synchronized=self.synchronized, ntp_active=self.ntp_active)


class SteppedWall:
    """``time.time`` plus an offset; ``step`` moves it as NTP would (install with
    ``monkeypatch.setattr(time, "time", wall)`` so every module's wall clock follows)."""

    def __init__(self) -> None:
        self._real = time.time
        self._strftime = time.strftime
        self.offset = 0.0

    def __call__(self) -> float:
        return self._real() + self.offset

    def step(self, seconds: float) -> None:
        self.offset += seconds

    def strftime(self, fmt: str, when: time.struct_time | None = None) -> str:
        """``time.strftime`` on this clock (the C library's "now" does not follow ``time``)."""
        return self._strftime(fmt, when if when is not None else time.localtime(self()))
