"""The last hour and the last day of the figures the airtime charts draw, in fixed buckets.

Invariants:
- Two rings of fixed length (``HOUR``: 60 one-minute buckets; ``DAY``: 96 quarter-hour
  buckets), so memory is the same after a minute and after a year of uptime.
- Gauges (channel utilisation, the bot's share, first-part and whole-reply latency) keep the
  mean of the samples that fell into a bucket; counts (answers, notices, holds) keep how many
  happened in it, from the difference of the totals between two samples (a restart starts
  from zero).
- Buckets are aligned on wall-clock time; empty buckets (nothing sampled: bot stopped, no
  radio) draw as gaps, never as zeros.
- A wall clock stepped back (a Pi's NTP correction) drops the buckets dated after the new
  time: they lie in a future the chart's axis cannot show, and keeping them would hold every
  new sample in the last of them (before, a day back drew 0 of 60 buckets for the next day).
  Less than a step (``bot.clock.STEP_SECONDS``: a sample a moment out of order) joins the
  last bucket. A step forward leaves its gap.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from bot.clock import STEP_SECONDS
from bot.web.model import Snapshot

GAUGES = ("channel", "bot_share", "others", "latency", "first_part")
COUNTS = ("answers", "notices", "limited", "hold_channel", "hold_duty")


@dataclass
class Bucket:
    start: float
    sums: dict[str, float] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def mean(self, name: str) -> float | None:
        n = self.samples.get(name, 0)
        return self.sums[name] / n if n else None


class Ring:
    def __init__(self, *, width: float, size: int) -> None:
        self.width = width
        self.size = size
        self._buckets: deque[Bucket] = deque(maxlen=size)

    def _bucket(self, at: float) -> Bucket:
        start = math.floor(at / self.width) * self.width
        # The clock stepped back (a sample a moment out of order, two samples collected at
        # once, is no step: it joins the last bucket).
        while self._buckets and self._buckets[-1].start > at + STEP_SECONDS:
            self._buckets.pop()
        if not self._buckets or self._buckets[-1].start < start:
            self._buckets.append(Bucket(start))
        return self._buckets[-1]

    def add(self, at: float, gauges: Mapping[str, float | None], counts: Mapping[str, int]) -> None:
        b = self._bucket(at)
        for name, value in gauges.items():
            if value is not None:
                b.sums[name] = b.sums.get(name, 0.0) + value
                b.samples[name] = b.samples.get(name, 0) + 1
        for name, n in counts.items():
            if n:
                b.counts[name] = b.counts.get(name, 0) + n

    def series(self, now: float) -> list[Bucket | None]:
        """``size`` slots ending with the bucket holding ``now``; None where nothing was kept."""
        last = math.floor(now / self.width) * self.width
        by_start = {b.start: b for b in self._buckets}
        return [by_start.get(last - (self.size - 1 - i) * self.width) for i in range(self.size)]

    def __len__(self) -> int:
        return len(self._buckets)


class History:
    def __init__(self) -> None:
        self.hour = Ring(width=60.0, size=60)
        self.day = Ring(width=900.0, size=96)
        self._last: dict[str, float] | None = None

    def add(self, snap: Snapshot) -> None:
        totals = _totals(snap)
        counts: dict[str, int] = {}
        if self._last is not None:
            for name in COUNTS:
                delta = totals[name] - self._last.get(name, 0.0)
                counts[name] = int(delta) if delta > 0 else 0  # a restart resets the totals
        before = self._last or totals
        answered = totals["answers"] - before["answers"]
        spent = totals["reply_seconds"] - before["reply_seconds"]
        firsts = totals["first_parts"] - before["first_parts"]
        first_spent = totals["first_part_seconds"] - before["first_part_seconds"]
        self._last = totals
        mesh = snap.mesh
        gauges: dict[str, float | None] = {
            "channel": mesh.channel_utilization if mesh else None,
            "bot_share": mesh.bot_hour_share if mesh else None,
            "others": mesh.others if mesh else None,
            "latency": spent / answered if answered > 0 else None,
            "first_part": first_spent / firsts if firsts > 0 else None,
        }
        for ring in (self.hour, self.day):
            ring.add(snap.at, gauges, counts)


def _totals(snap: Snapshot) -> dict[str, float]:
    holds = snap.mesh.holds if snap.mesh else {}
    return {
        "answers": float(snap.totals.get("answers", 0)),
        "notices": float(snap.totals.get("notices", 0)),
        "limited": float(snap.totals.get("limited", 0)),
        "hold_channel": float(holds.get("hold", 0)),
        "hold_duty": float(holds.get("duty", 0)),
        "reply_seconds": snap.first_reply_total,
        "first_parts": float(snap.first_part_count),
        "first_part_seconds": snap.first_part_total,
    }
