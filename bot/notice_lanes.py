"""Notice lanes: a person's notices on a paced radio go beside their turns, never behind them.

``NoticeLanes`` runs them; ``Notices`` (composed by ``bot.responder``, used by the intake and
the answerer) sends notices and decides which notices from intake take a lane: limit notices on
a paced radio; the hold notice of a question whose person's worker is busy (or whose turn finds
no notice may go on air now); and, when that worker is busy and the radio's queue is full, the
"busy, try again" refusal (stored with the question ``limited`` in one transaction, exactly what
the turn would have done later).

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
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

from bot.delivery import STORE_ERRORS, OutboxSender, busy_now
from bot.domain import Inbound
from bot.limits import PersonLimits
from bot.memory.records import OutboxEntry, OutboxRow
from bot.ops.metrics import Counters
from bot.transports.base import AwaitsAnswer, Congested, Transport
from bot.turn_queue import QueueKey, TurnQueue, queue_key

log = logging.getLogger("bot.notice_lanes")

Key = QueueKey
BUSY = "Busy: many replies are waiting to go out. Try again in {minutes} min."


def busy_text(seconds: float) -> str:
    """The "busy, try again in N min" notice for a queue that frees in ``seconds``."""
    return BUSY.format(minutes=max(1, math.ceil(seconds / 60)))


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


class Notices:
    """The notices of intake and turns (see the module docstring): the lanes, the limit
    notices, the hold notices, and which questions were told of a hold already."""

    def __init__(
        self,
        *,
        transports: Mapping[str, Transport],
        outbox: OutboxSender,
        limits: PersonLimits,
        lanes: NoticeLanes,
        queue: TurnQueue,
        counters: Counters,
    ) -> None:
        self._transports = transports
        self._outbox = outbox
        self._limits = limits
        self._lanes = lanes
        self._queue = queue  # whether new work is taken (shutdown)
        self._counters = counters
        self._told: set[int] = set()  # questions told of a hold in their lane (not again)

    def was_told(self, message_id: int) -> bool:
        """True when the question was told of a hold in its lane at intake (not again)."""
        return message_id in self._told

    def forget_told(self, message_id: int) -> None:
        self._told.discard(message_id)

    async def notice(self, inbound: Inbound, text: str) -> None:
        """A notice sent at once (never stored as something the model said)."""
        self._counters.add("notices")
        await self._outbox.notice(inbound, text)

    async def refuse_early(self, inbound: Inbound, message_id: int) -> bool:
        """A question arriving while the person's worker is busy (perhaps waiting on their
        earlier answer in a long radio queue) and the radio's queue is full: the turn would
        refuse it anyway, so refuse it now, truthfully: the question ``limited`` and the "busy,
        try again" notice stored in one transaction, sent in the person's lane. True when done
        (the turn is not queued)."""
        transport = self._transports.get(inbound.transport)
        if not isinstance(transport, Congested) or not self._queue.accepting:
            return False
        busy = busy_now(transport)
        if busy is None or busy.cause != "queue":
            return False
        text = transport.fit(busy_text(busy.seconds))
        entry = OutboxEntry(inbound.key, "notice", text, reply_to=inbound.message_id,
                            question_id=message_id)  # fmt: skip
        try:
            row = await self._outbox.store.queue_claimed(entry, question_status="limited")
        except STORE_ERRORS as exc:  # the turn decides then (and tells)
            log.warning("could not store a busy notice for %s now: %s", inbound.key, exc)
            return False
        self._outbox.written(row.id)  # aged from now, on the monotonic clock
        log.info("outbox of %s full and %s waits on an earlier reply: told to try again",
                 inbound.transport, inbound.key)  # fmt: skip
        self._lanes.add(queue_key(inbound), lambda: self._outbox.deliver_now(inbound, row))
        return True

    async def notice_once(self, inbound: Inbound, text: str) -> None:
        who = (inbound.transport, inbound.sender)
        transport = self._transports.get(inbound.transport)
        waiting = isinstance(transport, AwaitsAnswer) and transport.awaits_answer(inbound)
        # one per window: a flood must not make us flood back (a slash command waits for one)
        if self._limits.may_notice(who) or waiting:
            await self.intake_notice(inbound, text)

    async def intake_notice(self, inbound: Inbound, text: str) -> None:
        """A notice from intake: a paced radio (``Congested``) gets it as an outbox row sent by
        the person's worker next, so its receive loop never waits for airtime; others at once."""
        if isinstance(self._transports[inbound.transport], Congested):
            row = await self._outbox.notice_later(inbound, text)
            if row is not None and self._queue.accepting:  # else the next round (or start) sends it
                self._outbox.in_flight.add(row.id)

                async def send(row: OutboxRow = row) -> None:
                    try:
                        await self._outbox.deliver(inbound, row)
                    finally:
                        self._outbox.in_flight.discard(row.id)

                self._lanes.add(queue_key(inbound), send)
        else:
            await self.notice(inbound, text)

    def tell_early(self, inbound: Inbound, message_id: int) -> None:
        """A question arriving during a hold while the person's worker is busy (perhaps
        waiting on their held answer), or a turn that finds no notice may go on air now: tell
        them of the hold in their notice lane, as soon as the radio may transmit."""
        transport = self._transports.get(inbound.transport)
        if not isinstance(transport, Congested) or not self._queue.accepting:
            return
        busy = busy_now(transport)
        if busy is None or busy.cause == "queue":
            return  # no hold (a full queue is told when the turn decides not to answer)
        self._told.add(message_id)

        async def tell() -> None:
            held = busy_now(transport)
            if held is not None and held.cause != "queue":  # (the hold may have ended)
                await self._outbox.tell_held(inbound, held, wait=True)

        self._lanes.add(queue_key(inbound), tell)
