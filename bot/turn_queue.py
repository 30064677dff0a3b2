"""The per-conversation queue of jobs: one worker task per conversation, jobs in arrival order.

A job (``bot.turn_jobs``: a delivery, a command, an incognito turn, a turn) is a value with its
own ``run``; the queue knows only what every job says of itself (``Job``): the conversation,
the stored question it answers, the outbox row it sends, whether it was recovered.

Invariants:
- Per conversation, jobs run one at a time, in arrival order, by a worker task that exits
  when its queue is empty; different conversations run at once. A recovered question goes
  before the person's later questions not started yet (heard live before recovery ran), so
  each answer comes in the order the questions were asked.
- A job that raises is logged and its ``failed`` runs (loop boundary); the worker goes on.
- ``questions`` holds every stored question queued or being answered here (recovery never
  queues one twice); an outbox row queued here is in the sender's ``in_flight`` until its job
  ends (a maintenance round never sends it beside its worker).
- After ``close`` (shutdown) no job is taken (``accepting`` is False) and a worker stops
  before a delivery job: the row stays in the outbox for the next start.
- Every worker task is owned (``workers``); ``idle`` is set when none runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from bot.delivery import OutboxSender
from bot.domain import Inbound
from bot.memory.records import OutboxRow

log = logging.getLogger("bot.turn_queue")

QueueKey = tuple[str, str, str]  # (transport, person, space)


def queue_key(inbound: Inbound) -> QueueKey:
    key = inbound.key
    return (key.transport, key.person, key.space)


class Job(Protocol):
    """One unit of a conversation's work (``bot.turn_jobs``)."""

    @property
    def inbound(self) -> Inbound: ...

    @property
    def question(self) -> int | None:
        """The stored question this job answers (None: a command, a delivery, incognito)."""

    @property
    def row(self) -> OutboxRow | None:
        """The stored outbox row this job (re)sends (None: it sends none of its own)."""

    @property
    def recovered(self) -> bool:
        """Stored before a restart, or by a gateway that died (queued by recovery)."""

    async def run(self) -> None: ...

    async def failed(self) -> None:
        """After ``run`` raised: tell the person briefly, settle what is stored."""


class TurnQueue:
    def __init__(self, *, outbox: OutboxSender) -> None:
        self._outbox = outbox
        self._queues: dict[QueueKey, deque[Job]] = {}
        self.workers: dict[QueueKey, asyncio.Task[None]] = {}
        self.questions: set[int] = set()  # stored questions queued or being answered here
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = True

    @property
    def accepting(self) -> bool:
        """False once ``close`` ran: new work waits in the store for the next start."""
        return self._accepting

    def close(self) -> None:
        self._accepting = False

    def busy(self, inbound: Inbound) -> bool:
        """True when this conversation's worker runs (the new job waits behind it)."""
        return queue_key(inbound) in self.workers

    def update_waiting(self, inbound: Inbound, update: Callable[[Job], Job]) -> None:
        """Replace each job of the conversation not started yet with ``update(job)``."""
        queue = self._queues.get(queue_key(inbound))
        if queue is None:
            return
        for i in range(1, len(queue)):  # the first one runs now
            queue[i] = update(queue[i])

    def queued_for(self, transport: str, sender: str) -> int:
        """Jobs of a person (any space) queued or running, deliveries not counted."""
        who = (transport, sender)
        return sum(
            sum(1 for job in q if job.row is None)
            for key, q in self._queues.items()
            if key[:2] == who
        )

    def waiting(self) -> tuple[int, int]:
        """(people with jobs queued or running, jobs queued or running): counts only."""
        people = {key[:2] for key, q in self._queues.items() if q}
        return len(people), sum(len(q) for q in self._queues.values())

    def put(self, job: Job) -> None:
        qkey = queue_key(job.inbound)
        if job.row is not None:
            self._outbox.in_flight.add(job.row.id)
        mine = job.question
        if mine is not None:
            self.questions.add(mine)
        queue = self._queues.setdefault(qkey, deque())
        if job.recovered and mine is not None:
            # before the person's later questions not started yet (heard live before recovery
            # ran): each answer in the order the questions were asked
            later = (i for i in range(1, len(queue)) if (queue[i].question or 0) > mine)
            queue.insert(next(later, len(queue)), job)
        else:
            queue.append(job)
        if qkey not in self.workers:
            self._idle.clear()
            self.workers[qkey] = asyncio.create_task(self._work(qkey), name=f"turns {qkey}")

    async def _work(self, qkey: QueueKey) -> None:
        queue = self._queues[qkey]
        try:
            while queue:
                job = queue[0]
                if not self._accepting and job.row is not None:
                    break  # shutting down: the row stays in the outbox for the next start
                try:
                    await job.run()
                except Exception:  # loop boundary: one bad turn must not stop this person's queue
                    log.exception("turn failed in %s", job.inbound.key)
                    await job.failed()
                finally:
                    queue.popleft()
                    if job.question is not None:
                        self.questions.discard(job.question)
                    if job.row is not None:
                        self._outbox.in_flight.discard(job.row.id)
        finally:
            self._queues.pop(qkey, None)
            self.workers.pop(qkey, None)
            if not self.workers:
                self._idle.set()

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def drain(self, *, timeout: float) -> None:
        """Wait for the jobs in flight (up to ``timeout``), then cancel what is left. A worker
        only waiting for its transport to deliver is cut at once (its row stays pending, sent
        at the next start), so a long mesh queue never makes a shutdown slow."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self.workers and loop.time() < end:
            if set(self.workers) <= self._outbox.delivering:
                break
            await asyncio.wait(list(self.workers.values()), timeout=0.05)
        workers = list(self.workers.values())
        if workers:
            _done, pending = await asyncio.wait(workers, timeout=0)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d conversation(s) cut off at shutdown", len(pending))
                await asyncio.gather(*pending, return_exceptions=True)
