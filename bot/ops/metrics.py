"""Numbers the status file reports, gathered without touching the reply path's logic.

Invariants:
- ``TimedLLM`` is the LLM port around another LLM: same answers, same errors; it only records
  how long each successful call took (a bounded window, so memory stays flat for months).
- ``LastError`` is a logging handler keeping the newest ERROR record's time, logger and first
  line. Error records never carry message text (privacy rule for every logger), so neither
  does the status file.
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


class Latencies:
    def __init__(self, *, window: int = WINDOW) -> None:
        self._seconds: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self._seconds.append(seconds)

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
        result = await self._llm.complete(messages, max_tokens=max_tokens, **kwargs)
        self._latencies.add(self._clock() - started)
        return result


class LastError(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.at: float | None = None
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            first = record.getMessage().splitlines()[0] if record.msg else ""
        except Exception:  # logging boundary: a bad format string must not break logging
            first = str(record.msg)
        self.at = record.created
        self.text = f"{record.name}: {first}"[:300]
