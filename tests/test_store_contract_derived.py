"""Contract suite for the ``Derived`` and ``SessionLog`` Protocols (bot.memory.port_derived):
summary chapters, facts and their extraction mark, sessions and the long-term summary. Every
test runs on SQLite and PostgreSQL (the ``memory`` fixture, tests/conftest.py)."""

from __future__ import annotations

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore
from tests.test_store_contract import ALICE, _say


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


async def test_facts_crud(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    a = await memory.add_fact(conv.id, text="one", tokens=1)
    await memory.add_fact(conv.id, text="two", tokens=1)
    assert [f.text for f in await memory.facts(conv.id)] == ["one", "two"]
    assert await memory.remove_fact(conv.id, a)
    assert not await memory.remove_fact(conv.id, a)
    assert [f.text for f in await memory.facts(conv.id)] == ["two"]


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


async def test_messages_a_link_moved_below_the_mark_wait_for_facts(memory: MemoryStore) -> None:
    """``link_dm`` flags the other side's messages the home's mark already passed, so the next
    extraction reads them (``facts_pending``); moving the mark over them clears the flags."""
    other = ConversationKey("discord", "42")
    early = await _say(memory, other, "my dog is called Rex")
    await _say(memory, ALICE, "one")
    last = await _say(memory, ALICE, "two")
    home = await memory.conversation(ALICE)
    await memory.set_facts_through(home.id, last)
    await memory.set_facts_through(home.id, last - 1)  # never back
    assert await memory.facts_through(home.id) == last
    assert await memory.facts_pending(home.id) == []
    assert await memory.link_dm(ALICE, other) == 1
    assert [m.id for m in await memory.facts_pending(home.id)] == [early]
    await memory.set_facts_through(home.id, last)
    assert await memory.facts_pending(home.id) == []


async def test_idle_conversations_are_those_talked_in_since_their_last_session(
    memory: MemoryStore,
) -> None:
    conv = await memory.conversation(ALICE)
    first = await memory.add_message(conv.id, role="user", author="a", text="hi", tokens=1,
                                     status="answered", created_at=100.0)  # fmt: skip
    assert await memory.idle_conversations(idle_before=50.0, limit=5) == []  # not idle yet
    assert await memory.idle_conversations(idle_before=200.0, limit=5) == [conv.id]
    assert not await memory.has_longterm_summary(conv.id)
    await memory.add_session(conv.id, first_message_id=first, last_message_id=first,
                             started_at=100.0, ended_at=100.0, messages=1)  # fmt: skip
    assert await memory.idle_conversations(idle_before=200.0, limit=5) == []  # closed
    await memory.save_longterm_summary(conv.id, text="L", tokens=1, sessions=1,
                                       up_to_message_id=first)  # fmt: skip
    assert await memory.has_longterm_summary(conv.id)
