"""Notice lanes: a person's notices on a paced radio go beside their turns, never behind them.

On the mesh a person's turn worker (``bot.responder``) can wait a long time on the transport:
an answer held by the airtime rules waits up to ``busy_max_wait`` in the radio's outbox, and
every outbox round offers it again. A notice for that person (the answer to a newer question is
held; over a limit) queued behind it would reach them minutes late or never. A lane sends such
notices at once, beside the worker, one after the other per person; the transport itself puts
one-packet notices before held answers.

Invariants:
- One lane task per person at most, owned here (``_tasks``), ending when its queue is empty;
  ``stop`` cancels them (a notice row stays in the outbox for the next start; a hold notice
  that was not stored is not needed: the stored answer reaches the person anyway).
- A step that raises is logged and never stops the lane (loop boundary).
- ``idle`` is true when no lane runs; ``wait_idle`` returns then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

log = logging.getLogger("bot.responder")

Key = tuple[str, str, str]  # (transport, person, space)
Step = Callable[[], Awaitable[object]]


class NoticeLanes:
    def __init__(self) -> None:
        self._queues: dict[Key, deque[Step]] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, key: Key, step: Step) -> None:
        """Run ``step`` in ``key``'s lane, after the notices already queued there."""
        self._queues.setdefault(key, deque()).append(step)
        if key not in self._tasks:
            self._idle.clear()
            self._tasks[key] = asyncio.create_task(self._run(key), name=f"notices {key}")

    async def _run(self, key: Key) -> None:
        queue = self._queues[key]
        try:
            while queue:
                step = queue[0]
                try:
                    await step()
                except Exception:  # loop boundary: one notice must not stop the others
                    log.exception("sending a notice to %s failed", key)
                finally:
                    queue.popleft()
        finally:
            self._queues.pop(key, None)
            self._tasks.pop(key, None)
            if not self._tasks:
                self._idle.set()

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def stop(self) -> None:
        """Cancel every lane (shutdown) and wait for them to end."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
