"""A virtual clock for time-dependent tests: sleeps finish when the world is quiet.

``FakeClock`` satisfies ``bot.transports.mesh_rules.Clock``. ``sleep(dt)`` registers a deadline;
a driver task advances virtual time to the *earliest* deadline once nothing else is happening:
the event loop has had a short real pause, and every ``settle`` hook (e.g. "the fake radio has
read everything the library wrote, the library has handled everything the radio wrote") reports
quiet. So a 45 s ACK timeout takes milliseconds, yet an ACK that is on its way always wins, and
timestamps taken by the fake radio from this clock are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable


class FakeClock:
    def __init__(self, *, start: float = 1000.0, idle: float = 0.005) -> None:
        self._now = start
        self._idle = idle
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._driver: asyncio.Task[None] | None = None
        self.settle_hooks: list[Callable[[], bool]] = []  # True when it had to wait for activity

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (self._now + seconds, next(self._seq), fut))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        await fut

    async def _drive(self) -> None:
        while True:
            while self._heap and self._heap[0][2].done():
                heapq.heappop(self._heap)  # cancelled sleepers
            if not self._heap:
                return
            quiet = 0
            while quiet < 2:  # two quiet looks in a row: nothing is on its way
                await asyncio.sleep(self._idle)  # real time: let threads and callbacks run
                quiet = 0 if any([hook() for hook in self.settle_hooks]) else quiet + 1
            while self._heap and self._heap[0][2].done():
                heapq.heappop(self._heap)
            if not self._heap:
                return
            deadline, _, fut = heapq.heappop(self._heap)
            self._now = max(self._now, deadline)
            fut.set_result(None)

    async def close(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
