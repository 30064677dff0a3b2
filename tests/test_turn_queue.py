"""The per-conversation queue of jobs (``bot.turn_queue``) on its own, with jobs that record
what ran: order within a conversation, a recovered question ahead of later ones, a failing job
told and passed, a delivery left in the outbox at shutdown."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bot.delivery import OutboxSender
from bot.domain import Inbound
from bot.memory.records import OutboxEntry, OutboxRow
from bot.memory.store import SqliteStore
from bot.turn_queue import TurnQueue


@dataclass
class Log:
    ran: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # held jobs wait for it


@dataclass(frozen=True)
class Step:
    inbound: Inbound
    name: str
    log: Log
    question: int | None = None
    row: OutboxRow | None = None
    recovered: bool = False
    wait: bool = False  # waits for ``log.gate`` (keeps the worker busy)
    boom: bool = False

    async def run(self) -> None:
        if self.wait:
            await self.log.gate.wait()
        if self.boom:
            raise RuntimeError("the turn broke")
        self.log.ran.append(self.name)

    async def failed(self) -> None:
        self.log.failed.append(self.name)


def _inbound(sender: str = "alice") -> Inbound:
    return Inbound(transport="fake", sender=sender, space="dm", text="hi",
                   received_at=datetime.now(UTC))  # fmt: skip


def _row(row_id: int) -> OutboxRow:
    entry = OutboxEntry(_inbound().key, "answer", "text")
    return OutboxRow(row_id, entry, "pending", (), 0.0, None)


def _queue(store: SqliteStore) -> tuple[TurnQueue, OutboxSender]:
    outbox = OutboxSender(store=store, transports={})
    return TurnQueue(outbox=outbox), outbox


async def test_a_conversation_runs_its_jobs_in_order_others_alongside(store: SqliteStore) -> None:
    queue, _ = _queue(store)
    log = Log()
    alice, bob = _inbound("alice"), _inbound("bob")
    queue.put(Step(alice, "a1", log, wait=True))
    queue.put(Step(alice, "a2", log))
    queue.put(Step(bob, "b1", log))
    await asyncio.sleep(0.01)
    assert log.ran == ["b1"]  # bob's turn did not wait behind alice's
    assert queue.busy(alice) and not queue.busy(bob)
    assert queue.waiting() == (1, 2) and queue.queued_for("fake", "alice") == 2
    log.gate.set()
    await queue.wait_idle()
    assert log.ran == ["b1", "a1", "a2"] and queue.idle and queue.waiting() == (0, 0)


async def test_a_recovered_question_goes_before_later_questions(store: SqliteStore) -> None:
    queue, _ = _queue(store)
    log = Log()
    alice = _inbound()
    queue.put(Step(alice, "running", log, question=5, wait=True))
    queue.put(Step(alice, "q9", log, question=9))
    queue.put(Step(alice, "q7 recovered", log, question=7, recovered=True))
    assert queue.questions == {5, 7, 9}
    log.gate.set()
    await queue.wait_idle()
    assert log.ran == ["running", "q7 recovered", "q9"]
    assert queue.questions == set()  # none held once answered


async def test_a_failing_job_is_told_and_the_next_one_runs(store: SqliteStore) -> None:
    queue, _ = _queue(store)
    log = Log()
    alice = _inbound()
    queue.put(Step(alice, "broken", log, boom=True))
    queue.put(Step(alice, "next", log))
    await queue.wait_idle()
    assert log.failed == ["broken"] and log.ran == ["next"]


async def test_after_close_a_delivery_stays_in_the_outbox(store: SqliteStore) -> None:
    queue, outbox = _queue(store)
    log = Log()
    alice = _inbound()
    queue.put(Step(alice, "turn", log, wait=True))
    queue.put(Step(alice, "delivery", log, row=_row(42)))
    assert 42 in outbox.in_flight and queue.queued_for("fake", "alice") == 1
    queue.close()
    assert not queue.accepting
    log.gate.set()
    await queue.drain(timeout=5)
    assert log.ran == ["turn"]  # the row is sent at the next start
    assert queue.idle and not queue.workers
