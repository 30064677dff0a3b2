"""Numbers the status file reports, gathered without touching the reply path's logic.

Invariants:
- ``TimedLLM`` is the LLM port around another LLM: same answers, same errors; it only records
  how long each successful call took (a bounded window, so memory stays flat for months).
- ``LastError`` is a logging handler keeping the newest ERROR record's time, logger and first
  line (and the ``RECENT_ERRORS`` newest, for the web view). Error records never carry
  message text (privacy rule for every logger), so neither does the status file.
- ``Latencies`` also keeps a cumulative histogram over fixed ``BUCKETS`` (all calls since
  start, for Prometheus) and ``TimedLLM`` counts failed calls; both are plain integers, so
  memory stays flat however long the bot runs.
- ``Counters`` are monotonic totals since start (turns, answers, notices, limited) and the
  latest first-reply latencies; names only, never a person or a text.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from bot.llm.port import LLM, ChatMessage, Completion

WINDOW = 200  # latest LLM calls the percentiles cover
# Histogram bounds in seconds (Prometheus ``le``): a Pi's CPU model takes 2-60 s per answer.
BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
RECENT_ERRORS = 5


class Latencies:
    def __init__(self, *, window: int = WINDOW) -> None:
        self._seconds: deque[float] = deque(maxlen=window)
        self.buckets = [0] * len(BUCKETS)  # cumulative: calls that took <= BUCKETS[i]
        self.total = 0  # every successful call since start
        self.total_seconds = 0.0
        self.failures = 0  # calls that raised (unavailable, timeouts, errors)
        self.last_ok: bool | None = None  # how the latest call ended (None: no call yet)

    def add(self, seconds: float) -> None:
        self._seconds.append(seconds)
        self.last_ok = True
        self.total += 1
        self.total_seconds += seconds
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1

    def __len__(self) -> int:
        return len(self._seconds)

    def percentile(self, p: float) -> float | None:
        """Nearest-rank percentile (0-100) of the window; None before the first call."""
        if not self._seconds:
            return None
        ordered = sorted(self._seconds)
        rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
        return ordered[rank - 1]


class TimedLLM:
    def __init__(
        self, *, llm: LLM, latencies: Latencies, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._llm = llm
        self._latencies = latencies
        self._clock = clock

    @property
    def model_name(self) -> str:
        return self._llm.model_name

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, **kwargs: Any
    ) -> Completion:
        started = self._clock()
        try:
            result = await self._llm.complete(messages, max_tokens=max_tokens, **kwargs)
        except Exception:
            self._latencies.failures += 1
            self._latencies.last_ok = False
            raise
        self._latencies.add(self._clock() - started)
        return result


class Counters:
    """Totals since start, fed by the responder (one dict increment per event)."""

    def __init__(self, *, window: int = WINDOW) -> None:
        self.totals: dict[str, int] = {"turns": 0, "answers": 0, "notices": 0, "limited": 0}
        self.first_reply: deque[float] = deque(maxlen=window)  # seconds, message to reply sent
        self.first_reply_total = 0.0
        # seconds from a message to its answer's first part accepted by the platform
        self.first_part: deque[float] = deque(maxlen=window)
        self.first_part_total = 0.0
        self.first_part_count = 0

    def add(self, name: str, n: int = 1) -> None:
        self.totals[name] = self.totals.get(name, 0) + n

    def replied(self, seconds: float) -> None:
        self.first_reply.append(seconds)
        self.first_reply_total += seconds

    def first_part_sent(self, seconds: float) -> None:
        self.first_part.append(seconds)
        self.first_part_total += seconds
        self.first_part_count += 1


class LastError(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.at: float | None = None
        self.text = ""
        self.recent: deque[tuple[float, str]] = deque(maxlen=RECENT_ERRORS)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            first = record.getMessage().splitlines()[0] if record.msg else ""
        except Exception:  # logging boundary: a bad format string must not break logging
            first = str(record.msg)
        self.at = record.created
        self.text = f"{record.name}: {first}"[:300]
        self.recent.append((self.at, self.text))
