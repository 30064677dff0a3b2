"""Whether the bot may act on its wall clock: a Raspberry Pi has no real-time clock.

A Pi boots at the last saved time (fake-hwclock) and NTP steps it forward minutes to days
later; a bad NTP source can step it back. ``ClockWatch`` notices such steps and tells the
parts that delete, expire or take over by wall-clock age whether they may, and by how much the
dates written before a step are off.

Invariants:
- A step is wall-clock progress that differs from monotonic progress (``time.monotonic``, the
  real one: never an app's virtual clock) by more than ``STEP_SECONDS`` between two looks
  (NTP's slew, at most 500 ppm, never gets there). Within a boot, a step between two runs is
  noticed the same way, from the record the last run left in ``CLOCK_FILE`` (same
  ``boot_id``; its tolerance grows with the time between the records, for slew).
- The clock is *trusted* unless: a step was noticed less than ``SETTLE_SECONDS`` ago and the
  system has not said since that it is synchronized; or the system says NTP is active but not
  synchronized yet, for at most ``UNSYNCED_WAIT`` after the start (an offline Pi never
  synchronizes: after that its clock is taken as it is). Where the system does not say
  (no systemd, a container), only steps count.
- Dates written before a step are off by the step: each step leaves an *era* (the stamps the
  old clock wrote, and how far behind the current clock it was; later steps add up). A date
  in an era that ran behind counts from its corrected date (``age``); retention never deletes
  a row whose corrected date is still within the retention window (``retention_cutoff``: the
  cutoff is held back, so it may keep an older row longer, never delete a newer one early).
  Dates written by a clock that ran ahead are in the future: their age is 0 (never expired),
  and retention deletes them late, by as much as the clock was ahead. An era is dropped once
  every stamp in it is older than anything it could protect (``ERA_KEEP``).
- Reading the system's state (``SystemSync``) runs a subprocess, so it happens only in
  ``refresh`` (a thread, from the maintenance loop), never at import or on the event loop;
  ``trusted`` uses the last reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from bot.files import private_dir
from bot.ops.status import write_atomic  # the state dir's one atomic writer

log = logging.getLogger("bot.clock")

STEP_SECONDS = 60.0  # wall progress off monotonic progress by more than this is a step
SLEW = 0.0005  # NTP slews at most 500 ppm: allowed drift between two records of a boot
SETTLE_SECONDS = 900.0  # after a step the system did not vouch for, the clock must run this long
UNSYNCED_WAIT = 900.0  # NTP active but not synchronized at start: wait this long at most
SYNC_EVERY = 60.0  # how often the system's own state is read (a subprocess)
ERA_KEEP = 400 * 86_400.0  # longer than any retention window (retention_days <= 36,500 aside)
CLOCK_FILE = "clock.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
SYNCED_MARKER = Path("/run/systemd/timesync/synchronized")  # systemd-timesyncd, once synced


@dataclass(frozen=True)
class Sync:
    """What the system says of its clock; None: it does not say."""

    synchronized: bool | None = None
    ntp_active: bool | None = None


class SyncState(Protocol):
    def read(self) -> Sync: ...


class SystemSync:
    """systemd's view (``timedatectl show``: the kernel's NTP flag, whatever daemon sets it),
    or systemd-timesyncd's marker file; neither readable: the system does not say."""

    def __init__(self, *, marker: Path = SYNCED_MARKER) -> None:
        self._marker = marker

    def read(self) -> Sync:
        exe = shutil.which("timedatectl")
        if exe is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                done = subprocess.run(
                    [exe, "show", "-p", "NTP", "-p", "NTPSynchronized"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                    check=False,
                )
                if done.returncode == 0:
                    values = dict(
                        line.split("=", 1) for line in done.stdout.splitlines() if "=" in line
                    )
                    return Sync(
                        synchronized=_yes(values.get("NTPSynchronized")),
                        ntp_active=_yes(values.get("NTP")),
                    )
        with contextlib.suppress(OSError):
            if self._marker.exists():
                return Sync(synchronized=True, ntp_active=True)
        return Sync()


def _yes(value: str | None) -> bool | None:
    return {"yes": True, "no": False}.get((value or "").strip())


@dataclass(frozen=True)
class Era:
    """Stamps ``start``..``end`` were written by a clock ``behind`` seconds behind the current
    one (negative: ahead)."""

    start: float
    end: float
    behind: float


class ClockWatch:
    """Notices wall-clock steps and says whether wall-clock ages may be acted on."""

    def __init__(
        self,
        *,
        sync: SyncState,
        path: Path | None = None,
        wall: Callable[[], float] | None = None,
        mono: Callable[[], float] = time.monotonic,
        boot_id: str | None = None,
    ) -> None:
        self._sync_port = sync
        self._path = path
        self._wall = wall if wall is not None else lambda: time.time()  # looked up per call
        self._mono = mono
        self._boot = boot_id if boot_id is not None else _boot_id()
        now, m = self._wall(), self._mono()
        self._started = m
        self._last = (now, m)  # the last look, to measure the next one against
        self._since = now  # first stamp of the current era (on this clock)
        self._eras: list[Era] = []
        self._stepped_at: float | None = None  # monotonic time of the last step not vouched for
        self._sync = Sync()
        self._sync_at = -float("inf")
        self._load(now, m)
        self._save()

    # --- looking ------------------------------------------------------------------------------
    def check(self) -> float | None:
        """Look now: the step noticed since the last look (seconds, + forward), else None."""
        now, m = self._wall(), self._mono()
        step = (now - self._last[0]) - (m - self._last[1])
        self._last = (now, m)
        if abs(step) <= STEP_SECONDS:
            return None
        self._stepped(step, now=now, m=m)
        return step

    def _stepped(self, step: float, *, now: float, m: float) -> None:
        end = now - step  # where the old clock stood now
        self._eras = [replace(e, behind=e.behind + step) for e in self._eras]
        self._eras.append(Era(start=min(self._since, end), end=end, behind=step))
        self._eras = [e for e in self._eras if abs(e.behind) > STEP_SECONDS]  # undone: right
        self._since = now
        self._stepped_at = m
        log.warning(
            "the wall clock stepped %s by %s; dates written before are read %s that, and "
            "nothing is pruned, expired or taken over by wall-clock age until the clock is "
            "trusted again (synchronized, or %.0f min without another step)",
            "forward" if step > 0 else "back", _span(abs(step)),
            "later by" if step > 0 else "earlier by", SETTLE_SECONDS / 60,
        )  # fmt: skip
        self._save()

    async def refresh(self) -> None:
        """Look, and read what the system says of its clock (a subprocess: in a thread) every
        ``SYNC_EVERY`` seconds, or at once after a step."""
        self.check()
        due = self._sync_at + SYNC_EVERY
        if self._mono() < due and (self._stepped_at is None or self._stepped_at < self._sync_at):
            return
        sync = await asyncio.to_thread(self._sync_port.read)
        self._sync, self._sync_at = sync, self._mono()

    def trusted(self) -> bool:
        """May wall-clock ages be acted on now (see the module docstring)?"""
        self.check()
        m = self._mono()
        if self._stepped_at is not None and m - self._stepped_at < SETTLE_SECONDS:
            vouched = self._sync.synchronized is True and self._sync_at > self._stepped_at
            if not vouched:
                return False
        waiting = self._sync.synchronized is False and self._sync.ntp_active is not False
        return not (waiting and m - self._started < UNSYNCED_WAIT)

    # --- dates written before a step ---------------------------------------------------------
    def age(self, stamp: float) -> float:
        """Seconds since ``stamp`` (a stored wall-clock date), counted from its corrected date
        when a clock that ran behind wrote it; never negative."""
        behind = max((e.behind for e in self._eras if e.start <= stamp <= e.end), default=0.0)
        return max(0.0, self._wall() - (stamp + max(0.0, behind)))

    def retention_cutoff(self, keep: float) -> float | None:
        """Rows dated before this may be deleted by a retention of ``keep`` seconds; None
        while the clock is not trusted (nothing is pruned then)."""
        if not self.trusted():
            return None
        cutoff = self._wall() - keep
        self._eras = [e for e in self._eras if e.end + max(0.0, e.behind) > self._wall() - ERA_KEEP]
        for era in self._eras:
            if era.behind > 0 and era.end + era.behind >= cutoff:  # some of it is newer in truth
                cutoff = min(cutoff, max(era.start, cutoff - era.behind))
        return cutoff

    # --- across restarts ------------------------------------------------------------------
    def _load(self, now: float, m: float) -> None:
        if self._path is None:
            return
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            eras = [Era(float(a), float(b), float(c)) for a, b, c in data.get("eras", [])]
            boot, wall, mono, since = data["boot"], data["wall"], data["mono"], data["since"]
        except (OSError, ValueError, TypeError, KeyError):
            return  # no record (first start) or an unreadable one: nothing known
        self._eras = eras
        if boot != self._boot or not boot:
            return  # another boot: the monotonic clocks do not compare
        step = (now - float(wall)) - (m - float(mono))
        if abs(step) <= max(STEP_SECONDS, SLEW * (m - float(mono))):
            self._since = min(now, float(since))  # one clock since the last run's era began
            return
        self._since = min(now, float(since))
        self._stepped(step, now=now, m=m)

    def _save(self) -> None:
        if self._path is None:
            return
        record = {
            "boot": self._boot,
            "wall": self._last[0],
            "mono": self._last[1],
            "since": self._since,
            "eras": [[e.start, e.end, e.behind] for e in self._eras],
        }
        try:
            private_dir(self._path.parent)
            write_atomic(self._path, json.dumps(record))
        except OSError as exc:  # a step across a restart may then go unnoticed; said once
            log.warning("could not record the clock in %s (%s); a clock step across a "
                        "restart will not be noticed", self._path, exc)  # fmt: skip


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return BOOT_ID.read_text(encoding="ascii").strip()
    return ""


def _span(seconds: float) -> str:
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"
