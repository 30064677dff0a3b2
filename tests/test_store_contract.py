"""Contract suite for the memory port: every MemoryStore implementation must pass it.

SQLite on a file, and PostgreSQL on a real server the suite starts itself (tests/pg_server.py),
as the bot's unprivileged role; the PostgreSQL runs are skipped, saying why, only when this
machine cannot start a server.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore
from bot.memory.records import OutboxEntry, StoredAnswer
from bot.memory.store import SqliteStore
from tests import pg_server
from tests.conftest import STORES

IMPLEMENTATIONS = STORES  # the other store suites import it from here
ALICE = ConversationKey("mesh", "!0000abcd")
BOB = ConversationKey("mesh", "!0000beef")


async def _say(m: MemoryStore, key: ConversationKey, text: str, role: str = "user") -> int:
    conv = await m.conversation(key)
    return await m.add_message(conv.id, role=role, author=key.person, text=text, tokens=2,
                               status="pending")  # fmt: skip


async def test_conversation_is_get_or_create(memory: MemoryStore) -> None:
    a = await memory.conversation(ALICE)
    assert (await memory.conversation(ALICE)).id == a.id
    assert await memory.find_conversation(BOB) is None
    dm, ch = (
        await memory.conversation(ALICE),
        await memory.conversation(ConversationKey(ALICE.transport, ALICE.person, "ch1")),
    )
    assert dm.id != ch.id
    assert [c.key.space for c in await memory.conversations_of("mesh", ALICE.person)] == [
        "dm", "ch1"
    ]  # fmt: skip


async def test_recent_messages_newest_first_and_after_reset(memory: MemoryStore) -> None:
    ids = [await _say(memory, ALICE, f"m{i}") for i in range(5)]
    conv = await memory.conversation(ALICE)
    assert [m.id for m in await memory.recent_messages(conv, limit=3)] == ids[:1:-1]
    assert [m.id for m in await memory.recent_messages(conv, limit=9, before_id=ids[2])] == [
        ids[1], ids[0]
    ]  # fmt: skip
    await memory.reset(conv.id)
    later = await _say(memory, ALICE, "after")
    conv = await memory.conversation(ALICE)
    assert [m.id for m in await memory.recent_messages(conv, limit=9)] == [later]


async def test_answers_marks_the_question_in_the_same_write(memory: MemoryStore) -> None:
    q = await _say(memory, ALICE, "question")
    conv = await memory.conversation(ALICE)
    await memory.add_message(conv.id, role="assistant", author="bot", text="answer", tokens=1,
                             status="sending", parent_id=q, answers=q)  # fmt: skip
    msgs = await memory.all_messages(conv.id)
    assert [(m.role, m.status) for m in msgs] == [("user", "answered"), ("assistant", "sending")]
    assert msgs[1].parent_id == q


async def test_reply_to_platform_id_resolves_the_parent(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    first = await memory.add_message(conv.id, role="assistant", author="bot", text="x",
                                     tokens=1, status="sent", platform_id="p-1")  # fmt: skip
    child = await memory.add_message(conv.id, role="user", author="a", text="y", tokens=1,
                                     status="pending", reply_to_platform_id="p-1")  # fmt: skip
    assert (await memory.messages_by_ids([child]))[0].parent_id == first


async def test_ancestors_walk_the_reply_chain_nearest_first(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    q = await _say(memory, ALICE, "question")
    a = await memory.add_message(conv.id, role="assistant", author="bot", text="answer", tokens=1,
                                 status="sent", parent_id=q, platform_id="p-9")  # fmt: skip
    r = await memory.add_message(conv.id, role="user", author="a", text="follow-up", tokens=1,
                                 status="pending", reply_to_platform_id="p-9")  # fmt: skip
    assert [m.id for m in await memory.ancestors(r, limit=5)] == [a, q]
    assert [m.id for m in await memory.ancestors(r, limit=1)] == [a]
    assert await memory.ancestors(q, limit=5) == []


async def test_search_is_scoped_to_one_conversation(memory: MemoryStore) -> None:
    mine = await _say(memory, ALICE, "my antenna is a yagi")
    await _say(memory, BOB, "bob also has a yagi antenna")
    conv = await memory.conversation(ALICE)
    hits = await memory.search_terms(conv.id, ["yagi", "antenna"], after_id=0, before_id=10**9)
    assert hits == [[mine], [mine]]
    assert [m[0] for m in await memory.outline(conv.id, after_id=0, before_id=10**9)] == [mine]


async def test_summary_refused_when_it_starts_before_the_reset(memory: MemoryStore) -> None:
    ids = [await _say(memory, ALICE, f"m{i}") for i in range(3)]
    conv = await memory.conversation(ALICE)
    assert await memory.save_summary(conv.id, text="s", first_message_id=ids[0],
                                     last_message_id=ids[1], tokens=1)  # fmt: skip
    await memory.reset(conv.id)
    assert not await memory.save_summary(conv.id, text="s2", first_message_id=ids[0],
                                         last_message_id=ids[2], tokens=1)  # fmt: skip
    assert await memory.latest_summary(await memory.conversation(ALICE)) is None


async def test_summary_chapters_append_and_a_merge_replaces_what_it_covers(
    memory: MemoryStore,
) -> None:
    ids = [await _say(memory, ALICE, f"m{i}") for i in range(6)]
    conv = await memory.conversation(ALICE)
    for text, first, last in (("c1", 0, 1), ("c2", 2, 3), ("c3", 4, 5)):
        assert await memory.save_summary(conv.id, text=text, first_message_id=ids[first],
                                         last_message_id=ids[last], tokens=1)  # fmt: skip
    assert [c.text for c in await memory.summaries(conv)] == ["c1", "c2", "c3"]
    assert (await memory.latest_summary(conv)).text == "c3"  # type: ignore[union-attr]
    assert await memory.save_summary(conv.id, text="c1+c2", first_message_id=ids[0],
                                     last_message_id=ids[3], tokens=1)  # fmt: skip
    chapters = await memory.summaries(conv)
    assert [(c.text, c.first_message_id, c.last_message_id) for c in chapters] == [
        ("c1+c2", ids[0], ids[3]),
        ("c3", ids[4], ids[5]),
    ]
    assert (await memory.latest_summary(conv)).text == "c3"  # type: ignore[union-attr]


async def test_forget_removes_every_row_of_that_person_only(memory: MemoryStore) -> None:
    await _say(memory, ALICE, "alice kumquat")
    await _say(memory, ConversationKey("mesh", ALICE.person, "ch0"), "channel kumquat")
    conv = await memory.conversation(ALICE)
    await memory.add_fact(conv.id, text="f", tokens=1)
    await memory.save_summary(conv.id, text="s", first_message_id=1, last_message_id=1,
                              tokens=1)  # fmt: skip
    bob = await _say(memory, BOB, "bob kumquat")
    report = await memory.forget_person("mesh", ALICE.person)
    assert (report.conversations, report.messages, report.summaries, report.facts) == (2, 2, 1, 1)
    assert await memory.conversations_of("mesh", ALICE.person) == []
    assert await memory.stats() == {"conversations": 1, "messages": 1, "summaries": 0,
                                    "facts": 0}  # fmt: skip
    old = await memory.search_terms(conv.id, ["kumquat"], after_id=0, before_id=10**9)
    assert old == [[]]
    bob_conv = await memory.conversation(BOB)
    assert await memory.search_terms(bob_conv.id, ["kumquat"], after_id=0,
                                     before_id=10**9) == [[bob]]  # fmt: skip


async def test_pending_messages_are_found_for_recovery(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    await memory.add_message(
        conv.id,
        role="assistant",
        author="bot",
        text="done",
        tokens=1,
        status="sent",
        answers=await _say(memory, ALICE, "answered"),
    )
    q = await _say(memory, ALICE, "unanswered")
    found = await memory.pending_messages(since=time.time() - 60, transports=["mesh"])
    assert [(key, m.id) for key, m in found] == [(ALICE, q)]
    assert await memory.pending_messages(since=time.time() - 60, transports=["discord"]) == []


async def test_every_pending_question_is_listed_and_stale_claims_are_found(
    memory: MemoryStore,
) -> None:
    """Several waiting questions of one person are each listed, oldest first (each gets its
    own answer; they were once folded into the latest); with ``stale_before`` only the ones
    whose claim is empty or older than it, stored before it."""
    first = await _say(memory, ALICE, "first")
    second = await _say(memory, ALICE, "second")
    third = await _say(memory, ALICE, "third")
    found = await memory.pending_messages(since=0, transports=["mesh"])
    assert [m.id for _, m in found] == [first, second, third]
    await asyncio.sleep(0.02)
    between = time.time()  # after the three were stored, before the claim
    await asyncio.sleep(0.02)
    assert await memory.claim_question(second, stale_before=time.time() - 300)
    assert (
        await memory.pending_messages(since=0, transports=["mesh"], stale_before=between - 60) == []
    )  # all stored just now: their gateway may still be at work
    stale = await memory.pending_messages(since=0, transports=["mesh"], stale_before=between)
    assert [m.id for _, m in stale] == [first, third]  # second's claim is newer: live
    later = await memory.pending_messages(
        since=0, transports=["mesh"], stale_before=time.time() + 1
    )
    assert [m.id for _, m in later] == [first, second, third]  # its claim went stale


async def test_waiting_replies_are_counted_per_transport(memory: MemoryStore) -> None:
    assert await memory.waiting_replies() == {}
    row = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "one"))
    await memory.queue_delivery(OutboxEntry(BOB, "answer", "two"))
    await memory.queue_delivery(OutboxEntry(ConversationKey("discord", "9"), "notice", "x"))
    assert await memory.waiting_replies() == {"mesh": 2, "discord": 1}
    await memory.finish_delivery(row, "delivered")
    assert await memory.waiting_replies() == {"mesh": 1, "discord": 1}


async def test_commands_are_held_until_released(memory: MemoryStore) -> None:
    first = await memory.hold_command(ALICE, "!facts", platform_id="7", author="alice")
    second = await memory.hold_command(BOB, "!reset", platform_id=None, author=None)
    held = await memory.held_commands(transports=["mesh"])
    assert [(c.id, c.key, c.text, c.platform_id) for c in held] == [
        (first, ALICE, "!facts", "7"),
        (second, BOB, "!reset", None),
    ]
    assert await memory.held_commands(transports=["discord"]) == []
    await memory.release_command(first)
    assert [c.id for c in await memory.held_commands(transports=["mesh"])] == [second]


async def test_facts_crud(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    a = await memory.add_fact(conv.id, text="one", tokens=1)
    await memory.add_fact(conv.id, text="two", tokens=1)
    assert [f.text for f in await memory.facts(conv.id)] == ["one", "two"]
    assert await memory.remove_fact(conv.id, a)
    assert not await memory.remove_fact(conv.id, a)
    assert [f.text for f in await memory.facts(conv.id)] == ["two"]


# --- memory tiers (issue 12) ----------------------------------------------------------------
async def test_a_backlog_of_sessions_is_recorded_at_once_and_never_twice(
    memory: MemoryStore,
) -> None:
    from bot.memory.records import SessionSpan

    ids = [await _say(memory, ALICE, f"m{i}") for i in range(120)]
    conv = await memory.conversation(ALICE)
    spans = [SessionSpan(ids[i], ids[i + 1], float(i), float(i + 1), 2)
             for i in range(0, 120, 2)]  # fmt: skip
    assert await memory.add_sessions(conv.id, []) == []
    first = await memory.add_sessions(conv.id, spans[:10])
    assert len(first) == 10 and first == sorted(first)
    new = await memory.add_sessions(conv.id, spans)  # another gateway had recorded 10 of them
    assert len(new) == 50 and min(new) > max(first)  # (more than one INSERT batch)
    assert await memory.add_sessions(conv.id, spans) == []
    recorded = await memory.sessions(conv.id)
    assert [(s.first_message_id, s.last_message_id) for s in recorded] == [
        (s.first_message_id, s.last_message_id) for s in spans]  # fmt: skip
    assert await memory.session_end(conv.id) == ids[-1]


async def test_sessions_never_overlap_and_carry_their_summary(memory: MemoryStore) -> None:
    a = await _say(memory, ALICE, "one")
    b = await _say(memory, ALICE, "two")
    conv = await memory.conversation(ALICE)
    sid = await memory.add_session(conv.id, first_message_id=a, last_message_id=b,
                                   started_at=1.0, ended_at=2.0, messages=2)  # fmt: skip
    assert sid is not None
    assert await memory.add_session(conv.id, first_message_id=b, last_message_id=b,
                                    started_at=2.0, ended_at=2.0, messages=1) is None  # fmt: skip
    assert await memory.session_end(conv.id) == b
    assert [s.id for s in await memory.unsummarized_sessions(limit=5)] == [sid]
    assert await memory.set_session_summary(sid, title="T", summary="S.", tokens=1)
    [s] = await memory.sessions(conv.id)
    assert (s.title, s.summary, s.messages) == ("T", "S.", 2)
    await memory.save_longterm_summary(conv.id, text="L1", tokens=1, sessions=1,
                                       up_to_message_id=a)  # fmt: skip
    await memory.save_longterm_summary(conv.id, text="L2", tokens=1, sessions=2,
                                       up_to_message_id=b)  # fmt: skip
    lt = await memory.longterm_summary(conv.id)
    assert lt is not None and (lt.text, lt.sessions, lt.up_to_message_id) == ("L2", 2, b)
    older = await memory.longterm_summary(conv.id, up_to=b - 1)  # the version a window shows
    assert older is not None and older.text == "L1"
    assert await memory.longterm_summary(conv.id, up_to=a - 1) is None
    assert await memory.longterm_summary(conv.id, written_before=0.0) is None
    assert await memory.clear_sessions(conv.id) == 1
    assert await memory.longterm_summary(conv.id) is None


async def test_pinned_facts_are_immutable_to_extraction(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    pinned = await memory.add_fact(conv.id, text="p", tokens=1)
    inferred = await memory.add_fact(conv.id, text="i", tokens=1, pinned=False, source_ids=[5])
    assert not await memory.update_fact(conv.id, pinned, text="x", tokens=1, source_ids=[])
    assert await memory.update_fact(conv.id, inferred, text="i2", tokens=1, source_ids=[3])
    assert not await memory.remove_fact(conv.id, pinned, extracted_only=True)
    facts = {f.id: f for f in await memory.facts(conv.id)}
    assert (facts[pinned].text, facts[pinned].pinned) == ("p", True)
    assert (facts[inferred].text, facts[inferred].source_ids) == ("i2", (3, 5))


async def test_a_new_value_keeps_the_old_one_in_the_facts_history(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    pinned = await memory.add_fact(conv.id, text="door code is 4521", tokens=3, source_ids=[1])
    inferred = await memory.add_fact(conv.id, text="wife is Anna", tokens=3, pinned=False,
                                     source_ids=[2])  # fmt: skip
    old = await memory.revise_fact(conv.id, pinned, text="door code is 7788", tokens=3,
                                   pinned=True, source_ids=[9], updated_at=100.0)  # fmt: skip
    assert old is not None and (old.text, old.pinned, old.source_ids) == ("door code is 4521",
                                                                          True, (1,))  # fmt: skip
    assert await memory.update_fact(conv.id, inferred, text="wife is Maria", tokens=3,
                                    source_ids=[4], updated_at=200.0)  # fmt: skip
    # The inferred one pinned by the person: any fact may take a new value this way.
    assert await memory.revise_fact(conv.id, inferred, text="wife is Maria Silva", tokens=4,
                                    pinned=True, source_ids=[7]) is not None  # fmt: skip
    facts = {f.id: f for f in await memory.facts(conv.id)}
    assert (facts[pinned].text, facts[pinned].source_ids) == ("door code is 7788", (9,))
    assert [(h.text, h.until, h.pinned, h.source_ids) for h in facts[pinned].history] == [
        ("door code is 4521", 100.0, True, (1,))
    ]
    assert [(h.text, h.pinned, h.source_ids) for h in facts[inferred].history] == [
        ("wife is Anna", False, (2,)), ("wife is Maria", False, (2, 4)),
    ]  # fmt: skip
    assert facts[inferred].pinned
    for n in range(8):  # bounded: the newest few values only
        await memory.revise_fact(conv.id, pinned, text=f"door code is {n}", tokens=3,
                                 pinned=True, source_ids=[])  # fmt: skip
    history = {f.id: f for f in await memory.facts(conv.id)}[pinned].history
    assert [h.text for h in history] == [f"door code is {n}" for n in range(2, 7)]
    assert await memory.revise_fact(conv.id, 10**9, text="x", tokens=1, pinned=True,
                                    source_ids=[]) is None  # fmt: skip
    assert await memory.remove_fact(conv.id, pinned)  # its history goes with it
    assert [f.id for f in await memory.facts(conv.id)] == [inferred]


async def test_prune_by_use_and_links_and_incognito(memory: MemoryStore) -> None:
    ids = [await _say(memory, ALICE, f"m{i}") for i in range(6)]
    for i in ids[:5]:
        await memory.set_status(i, "answered")  # ids[5] still awaits its answer: kept
    conv = await memory.conversation(ALICE)
    await memory.mark_important(conv.id, [ids[0]])
    await memory.note_retrieved([ids[1]])
    assert await memory.prune_by_use(3) == 3
    assert [m.id for m in await memory.all_messages(conv.id)] == [ids[0], ids[1], ids[5]]
    other = ConversationKey("discord", "42")
    await _say(memory, other, "from discord")
    assert await memory.link_dm(ALICE, other) == 1
    linked = await memory.conversation(other)
    assert linked.id == conv.id and linked.origin_id is not None
    assert await memory.unlink_dm(other) == 1
    assert await memory.unlink_dm(other) is None
    assert not await memory.is_incognito(conv.id)
    await memory.set_incognito(conv.id, True)
    assert await memory.is_incognito(conv.id)


async def test_dump_and_load_round_trip(memory: MemoryStore, tmp_path: Path) -> None:
    await _say(memory, ALICE, "hello")
    conv = await memory.conversation(ALICE)
    await memory.add_fact(conv.id, text="f", tokens=1, pinned=False, source_ids=[1])
    dump = await memory.dump_person(ALICE.transport, ALICE.person)
    empty = await IMPLEMENTATIONS[sorted(IMPLEMENTATIONS)[0]](tmp_path / "empty")
    try:
        counts = await empty.load_dump(ALICE.transport, ALICE.person, dump)
        assert counts["messages"] == 1 and counts["facts"] == 1
        assert await empty.dump_person(ALICE.transport, ALICE.person) == dump
    finally:
        await empty.close()


# --- the durable outbox -------------------------------------------------------------------------


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


async def test_context_for_a_second_question_includes_the_first_answer(
    memory: MemoryStore,
) -> None:
    q1 = await _say(memory, ALICE, "first question")
    q2 = await _say(memory, ALICE, "second question, sent before the first was answered")
    conv = await memory.conversation(ALICE)
    a1 = await memory.add_message(conv.id, role="assistant", author="bot", text="first answer",
                                  tokens=1, status="sent", parent_id=q1, answers=q1)  # fmt: skip
    seen = await memory.recent_messages(conv, limit=9, before_id=q2)
    assert [m.id for m in seen] == [a1, q1]


# --- outbox claims and planned packet ids (bot.memory.outbox_claims) -----------------------------


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


async def test_a_conversation_is_read_with_its_memory_incognito_flag(memory: MemoryStore) -> None:
    """``conversation`` carries the incognito flag of the memory it resolves to (a linked DM:
    the joined conversation's), so a message's intake needs no second read."""
    conv = await memory.conversation(ALICE)
    assert not conv.incognito
    await memory.set_incognito(conv.id, True)
    assert (await memory.conversation(ALICE)).incognito
    other = ConversationKey("discord", "42")
    await _say(memory, other, "from discord")
    assert await memory.link_dm(ALICE, other) == 1
    linked = await memory.conversation(other)
    assert linked.id == conv.id and linked.incognito
    await memory.set_incognito(conv.id, False)
    assert not (await memory.conversation(other)).incognito
