"""Contract suite for the ``Outbox`` Protocol (bot.memory.port_work): what must still reach
someone, its parts, claims and planned packet ids (bot.memory.outbox_claims), shown parts, and
the counts the web view shows. Every test runs on SQLite and PostgreSQL (the ``memory``
fixture, tests/conftest.py); two gateways on one PostgreSQL: test_store_contract_gateways.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore
from bot.memory.records import OutboxEntry, StoredAnswer
from bot.memory.store import SqliteStore
from tests import pg_server
from tests.test_store_contract import ALICE, BOB, _say


async def test_waiting_replies_are_counted_per_transport(memory: MemoryStore) -> None:
    assert await memory.waiting_replies() == {}
    row = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "one"))
    await memory.queue_delivery(OutboxEntry(BOB, "answer", "two"))
    await memory.queue_delivery(OutboxEntry(ConversationKey("discord", "9"), "notice", "x"))
    assert await memory.waiting_replies() == {"mesh": 2, "discord": 1}
    await memory.finish_delivery(row, "delivered")
    assert await memory.waiting_replies() == {"mesh": 1, "discord": 1}


async def test_answer_and_outbox_row_are_one_write(memory: MemoryStore) -> None:
    q = await _say(memory, ALICE, "question")
    conv = await memory.conversation(ALICE)
    entry = OutboxEntry(ALICE, "answer", "short …", reply_to="77", question_id=q, rest="tail")
    oid = await memory.queue_delivery(
        entry, answer=StoredAnswer(conv.id, "bot", "short and the whole tail", 5)
    )
    msgs = await memory.all_messages(conv.id)
    assert [(m.role, m.status, m.text) for m in msgs] == [
        ("user", "answered", "question"),
        ("assistant", "sending", "short and the whole tail"),  # the whole answer is memory
    ]
    assert msgs[1].parent_id == q
    [row] = await memory.undelivered(transports=["mesh"])
    assert (row.id, row.entry, row.state, row.parts, row.answer_id) == (
        oid, entry, "pending", (), msgs[1].id
    )  # fmt: skip
    assert await memory.undelivered(transports=["discord"]) == []


async def test_parts_are_recorded_and_finish_sets_the_answer_status(memory: MemoryStore) -> None:
    q = await _say(memory, ALICE, "question")
    conv = await memory.conversation(ALICE)
    oid = await memory.queue_delivery(
        OutboxEntry(ALICE, "answer", "a", question_id=q), answer=StoredAnswer(conv.id, "b", "a", 1)
    )
    await memory.record_part(oid, 1, "202")
    await memory.record_part(oid, 0, "101")
    [row] = await memory.undelivered(transports=["mesh"])
    assert row.parts == ((0, "101"), (1, "202"))
    await memory.finish_delivery(oid, "delivered")
    assert await memory.undelivered(transports=["mesh"]) == []
    answer = (await memory.all_messages(conv.id))[-1]
    assert (answer.status, answer.platform_id) == ("delivered", "101")
    row2 = await memory.outbox_row(oid)
    assert row2 is not None and row2.state == "delivered"
    with pytest.raises(ValueError):
        await memory.finish_delivery(oid, "pending")


async def test_scrub_and_prune_take_only_finished_rows(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    await memory.conversation(BOB)
    done = await memory.queue_delivery(OutboxEntry(ALICE, "command", "1) locker 5150"))
    await memory.finish_delivery(done, "delivered")
    waiting = await memory.queue_delivery(OutboxEntry(ALICE, "command", "again: locker 5150"))
    other = await memory.queue_delivery(OutboxEntry(BOB, "command", "bob: locker 5150"))
    await memory.finish_delivery(other, "delivered")
    assert await memory.scrub_outbox(conv.id, "locker 5150") == 1
    assert await memory.outbox_row(done) is None
    assert await memory.outbox_row(waiting) is not None  # pending: delivery needs it
    assert await memory.outbox_row(other) is not None  # another person's row
    assert await memory.prune_outbox(time.time() - 3600) == 0  # finished within the hour
    assert await memory.prune_outbox(time.time() + 1) == 1  # only the finished one
    assert await memory.outbox_row(waiting) is not None


async def test_a_notice_can_settle_its_question(memory: MemoryStore) -> None:
    q = await _say(memory, ALICE, "question")
    conv = await memory.conversation(ALICE)
    await memory.queue_delivery(
        OutboxEntry(ALICE, "notice", "LLM unavailable", question_id=q), question_status="failed"
    )
    assert [m.status for m in await memory.all_messages(conv.id)] == ["failed"]
    await memory.queue_delivery(OutboxEntry(BOB, "notice", "unsaved"))  # no stored question
    assert [r.entry.key for r in await memory.undelivered(transports=["mesh"])] == [ALICE, BOB]


async def test_take_more_hands_out_the_rest_once(memory: MemoryStore) -> None:
    assert await memory.take_more(ALICE) is None
    await memory.queue_delivery(OutboxEntry(ALICE, "answer", "first …", rest="second"))
    await memory.queue_delivery(OutboxEntry(ALICE, "notice", "rate limited"))  # not an answer
    assert await memory.take_more(BOB) is None
    assert await memory.take_more(ALICE) == "second"
    assert await memory.take_more(ALICE) is None


async def test_forget_deletes_the_outbox_rows_of_that_person(memory: MemoryStore) -> None:
    await memory.queue_delivery(OutboxEntry(ALICE, "answer", "secret", rest="more secret"))
    await memory.queue_delivery(OutboxEntry(BOB, "answer", "bob's"))
    await memory.forget_person("mesh", ALICE.person)
    assert [r.entry.key for r in await memory.undelivered(transports=["mesh"])] == [BOB]
    assert await memory.take_more(ALICE) is None
    await memory.record_part(1, 0, "late")  # a part that went out while the row was deleted
    assert await memory.outbox_row(1) is None


async def test_a_row_is_claimed_once_and_a_claimed_row_is_not_listed(memory: MemoryStore) -> None:
    oid = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "hi"))
    await memory.record_part(oid, 0, "11")
    row = await memory.claim_delivery(oid)
    assert row is not None and row.id == oid and row.parts == ((0, "11"),)  # as it stands now
    assert await memory.claim_delivery(oid) is None  # compare-and-set: the second ask loses
    assert await memory.undelivered(transports=["mesh"]) == []
    await memory.release_delivery(oid)  # waits for its link: any round may claim it again
    assert [r.id for r in await memory.undelivered(transports=["mesh"])] == [oid]
    assert await memory.claim_delivery(oid) is not None
    await memory.finish_delivery(oid, "delivered")
    await memory.release_delivery(oid)
    assert await memory.claim_delivery(oid) is None  # finished rows are never claimed
    assert await memory.claim_delivery(oid + 1000) is None  # nor rows that do not exist


async def test_a_row_queued_claimed_is_never_listed_until_released(memory: MemoryStore) -> None:
    oid = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "streaming"), claim=True)
    assert await memory.undelivered(transports=["mesh"]) == []
    assert await memory.claim_delivery(oid) is None
    assert await memory.release_stale_claims() == 0  # this process's own claim is live
    await memory.release_delivery(oid)
    assert [r.id for r in await memory.undelivered(transports=["mesh"])] == [oid]


async def test_stale_claims_of_a_dead_process_are_released(
    memory: MemoryStore, tmp_path: Path
) -> None:
    oid = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "owed"), claim=True)
    done = await memory.queue_delivery(OutboxEntry(BOB, "answer", "done"), claim=True)
    await memory.finish_delivery(done, "sent")
    # the same gateway restarted: a new store on the same database (the old one "died")
    if isinstance(memory, SqliteStore):
        again: MemoryStore = await SqliteStore.open(memory.path)
    else:
        from bot.memory.postgres import PostgresStore

        assert isinstance(memory, PostgresStore)
        again = await PostgresStore.open(
            memory.url, password=pg_server.BOT_PASSWORD, gateway=memory.gateway
        )
    try:
        assert again.claim_owner != memory.claim_owner
        assert await again.undelivered(transports=["mesh"]) == []
        assert await again.release_stale_claims() == 1  # only the pending row's claim
        [row] = await again.undelivered(transports=["mesh"])
        assert row.id == oid
    finally:
        await again.close()


async def test_a_part_keeps_the_first_packet_id_planned_for_it(memory: MemoryStore) -> None:
    oid = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "two parts"))
    assert await memory.plan_part(oid, 0, 0x1234) == 0x1234
    assert await memory.plan_part(oid, 0, 0x9999) == 0x1234  # a re-send repeats the id
    assert await memory.plan_part(oid, 1, 0xFFFF_FFF0) == 0xFFFF_FFF0  # ids are 32-bit
    row = await memory.outbox_row(oid)
    assert row is not None and row.packet_ids == ((0, 0x1234), (1, 0xFFFF_FFF0))
    await memory.forget_person("mesh", ALICE.person)
    assert await memory.plan_part(oid, 2, 7) == 0  # the row is gone (!forget)


async def test_shown_parts_are_kept_by_question_until_its_row_is_finished(
    memory: MemoryStore,
) -> None:
    """A streamed answer's messages, recorded as posted (before its outbox row exists), come
    back with the row after a restart; a deleted message is dropped; finishing clears them."""
    qid = await _say(memory, ALICE, "a long question")
    await memory.record_shown(qid, 0, "1001")
    await memory.record_shown(qid, 1, "1002")
    await memory.record_shown(qid, 2, "1003")
    await memory.record_shown(qid, 2, None)  # deleted again (a shorter text)
    await memory.record_shown(qid, 1, "1012")  # the same part re-posted
    assert await memory.shown_parts(qid) == ((0, "1001"), (1, "1012"))
    oid = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "x", question_id=qid))
    row = await memory.outbox_row(oid)
    assert row is not None and row.shown == ((0, "1001"), (1, "1012"))
    await memory.finish_delivery(oid, "delivered")
    assert await memory.shown_parts(qid) == ()
    other = await _say(memory, ALICE, "another")
    await memory.record_shown(other, 0, "2001")
    await memory.forget_person("mesh", ALICE.person)
    assert await memory.shown_parts(other) == ()
    await memory.record_shown(other, 1, "2002")  # the question is gone (!forget): ignored
    assert await memory.shown_parts(other) == ()


async def test_a_claimed_row_comes_back_from_the_write_as_a_read_would_see_it(
    memory: MemoryStore,
) -> None:
    """``queue_claimed`` returns the new row from its own write (no second read): the same
    ``OutboxRow`` that ``outbox_row`` reads afterwards, shown parts included, for an answer
    (which stores the assistant turn), a notice that settles its question, and a reply to no
    question; and the row is claimed (no outbox round lists it)."""
    qid = await _say(memory, ALICE, "a long question")
    await memory.record_shown(qid, 1, "1002")
    await memory.record_shown(qid, 0, "1001")
    answer = StoredAnswer((await memory.conversation(ALICE)).id, "meshsage", "the whole answer", 3)
    row = await memory.queue_claimed(
        OutboxEntry(ALICE, "answer", "the whole", reply_to="p1", question_id=qid, rest="answer"),
        answer=answer,
    )
    assert row.answer_id is not None and row.shown == ((0, "1001"), (1, "1002"))
    assert await memory.outbox_row(row.id) == row
    assert [m.text for m in await memory.all_messages(answer.conversation_id)][-1] == answer.text
    assert await memory.undelivered(transports=("mesh",)) == []
    other = await _say(memory, ALICE, "another question")
    notice = await memory.queue_claimed(
        OutboxEntry(ALICE, "notice", "LLM unavailable", question_id=other),
        question_status="failed",
    )
    assert notice.answer_id is None and notice.shown == ()
    assert await memory.outbox_row(notice.id) == notice
    assert not await memory.claim_question(other, stale_before=time.time())  # settled: failed
    plain = await memory.queue_claimed(OutboxEntry(ALICE, "command", "Forgotten."))
    assert await memory.outbox_row(plain.id) == plain and plain.entry.question_id is None


async def test_rows_are_counted_by_state_with_the_oldest(memory: MemoryStore) -> None:
    """What the web view shows (bot.web.model): this gateway's rows by state; one gateway
    alone sees no other."""
    assert await memory.outbox_by_state() == {}
    first = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "one"))
    await memory.queue_delivery(OutboxEntry(BOB, "answer", "two"))
    await memory.queue_delivery(OutboxEntry(BOB, "notice", "three"))
    await memory.finish_delivery(first, "delivered")
    states = await memory.outbox_by_state()
    assert {state: n for state, (n, _) in states.items()} == {"pending": 2, "delivered": 1}
    assert 0 < states["pending"][1] <= time.time()
    if isinstance(memory, SqliteStore):
        assert memory.outbox_gateway is None  # one process owns the file
    else:
        from bot.memory.postgres import PostgresStore

        assert isinstance(memory, PostgresStore) and memory.outbox_gateway == memory.gateway
    assert await memory.outbox_gateways(since=0.0) == []
