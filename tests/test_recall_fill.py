"""The budget a short window leaves goes to memory (issue 17 point 2), through the real context
builder on SQLite and a real PostgreSQL: the recall's spare-room filling and the most relevant
older chapter (a session summary) ride in the final message this once, never in the stored
note, the prompt stays within budget, and both stores send the same prompt."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from bot.llm.port import ChatMessage
from bot.llm.tokens import MESSAGE_OVERHEAD
from bot.memory.context import MORE_HEADER, RETRIEVED_HEADER
from bot.memory.layers import LayeredContext
from bot.memory.older_chapter import CHAPTER_HEADER
from bot.memory.port import MemoryStore
from bot.memory.records import SessionSpan
from tests.test_recall_notes import (
    BUDGET,
    COUNTER,
    KEY,
    _ask,
    _builder,
    _history,
    _pair,
    _recalled,
    prompts_on_both,
)

PLAN = (
    "Alice plans a sailing trip to Tromso in June with two friends from the radio club; "
    "they leave on 14 June from the north pier."
)


@pytest.fixture
def store(memory: MemoryStore) -> MemoryStore:
    """conftest's ``memory``: SQLite and a real PostgreSQL."""
    return memory


async def _with_session(store: MemoryStore) -> None:
    """The history, and its first stretch (the details) closed as a summarized session."""
    await _history(store)
    conv = await store.conversation(KEY)
    first = (await store.all_messages(conv.id))[:6]
    [sid] = await store.add_sessions(
        conv.id,
        [SessionSpan(first[0].id, first[-1].id, first[0].created_at, first[-1].created_at, 6)],
    )
    await store.set_session_summary(
        sid, title="Boat and trip", summary=PLAN, tokens=COUNTER.count(PLAN)
    )


async def test_the_best_matching_older_chapter_fills_the_free_budget_once(
    store: MemoryStore,
) -> None:
    await _with_session(store)
    builder = _builder(store)
    asked, mid = await _ask(store, builder, "When is the sailing trip to Tromso?", answer="June.")
    final = asked[-1].content
    assert CHAPTER_HEADER in final and PLAN in final  # nothing said matches: the chapter does
    assert final.index(PLAN) < final.index("When is the sailing trip")  # before the message
    note = (await store.recall_notes([mid])).get(mid, "")
    assert PLAN not in note  # transient: never the stored note
    nxt, _ = await _ask(store, builder, "thanks!", answer="ok")
    assert PLAN not in "\n".join(m.content for m in nxt)  # shown once
    # A message sharing too few words with any chapter gets none.
    other, _ = await _ask(store, builder, "Any tips for the weather tomorrow?")
    assert CHAPTER_HEADER not in other[-1].content


async def test_no_chapter_from_before_a_reset(store: MemoryStore) -> None:
    await _with_session(store)
    conv = await store.conversation(KEY)
    await store.reset(conv.id)
    asked, _ = await _ask(store, _builder(store), "When is the sailing trip to Tromso?")
    assert PLAN not in "\n".join(m.content for m in asked)


async def test_a_short_window_fills_with_turns_that_match_but_the_note_stays_small(
    store: MemoryStore,
) -> None:
    """After a restart the window is short: a complete match brings its turn (the note) and
    the room left takes turns holding the message's words themselves, shown once."""
    await _history(store)
    conv = await store.conversation(KEY)
    for i in range(6):  # more about the boat, each naming it
        await store.add_message(conv.id, role="user", author="alice",
                                text=f"Osprey got new sails, part {i}", tokens=8,
                                status="answered", created_at=1_800_000_000.0 + i)  # fmt: skip
    await _history(store, rounds=12)  # far back again
    asked, mid = await _ask(store, _builder(store), "Where is my boat Osprey moored?")
    final = asked[-1].content
    note = (await store.recall_notes([mid]))[mid]
    assert "north pier" in note and "sails" not in note
    assert final.startswith(note + "\n\n" + MORE_HEADER)
    assert "Osprey got new sails" in final.split(MORE_HEADER, 1)[1]
    assert RETRIEVED_HEADER in note


async def test_sqlite_and_postgres_send_the_same_prompt_with_the_tail_parts(
    tmp_path: Path,
) -> None:
    questions = (
        "When is the sailing trip to Tromso?",
        "Where is my boat Osprey moored?",
        "nice weather today",
        "Which frequency does the repeater use?",
    )
    prompts = await prompts_on_both(tmp_path, _with_session, questions)
    assert CHAPTER_HEADER in prompts[0][0][-1].content
    assert MORE_HEADER in "\n".join(m.content for p in prompts[0] for m in p)
    assert prompts[0] == prompts[1]
    assert all(sum(COUNTER.count(m.content) + 4 for m in p) <= BUDGET for p in prompts[0])


async def test_every_turn_matches_and_the_window_is_short(store: MemoryStore) -> None:
    """Issue 17's edge case "a history where every turn matches (a repeated phrase)" with room
    to fill: a chapter covers all but the newest turns (as after a fold or a restart). The
    room goes to readings not yet shown; none appears twice in one prompt; within budget."""
    reading = re.compile(r"The ridge weather station read (\d+) degrees at noon")
    at = 1_700_000_000.0
    for n in range(80):
        await _pair(store, f"The ridge weather station read {n} degrees at noon today.",
                    f"Noted: {n} degrees.", at)  # fmt: skip
        at += 60
    conv = await store.conversation(KEY)
    everything = await store.all_messages(conv.id)
    await store.save_summary(conv.id, text="They logged noon readings of the ridge station.",
                             first_message_id=everything[0].id,
                             last_message_id=everything[-7].id, tokens=10)  # fmt: skip
    builder = _builder(store)
    for i in range(3):
        messages, _ = await _ask(store, builder, "What did the ridge weather station read "
                                 "at noon?", answer=f"It varied ({i}).")  # fmt: skip
        shown = Counter(n for m in messages for n in reading.findall(m.content))
        assert shown and max(shown.values()) == 1, shown  # no reading twice in one prompt
        assert _recalled(messages)  # the short window left room: older readings came


async def test_the_long_term_reserve_a_short_summary_leaves_goes_to_the_tail_only(
    store: MemoryStore,
) -> None:
    """The constant reserve for the long-term summary keeps the window's fold points put; what
    a short summary leaves of it goes to the once-only recall, not to the window or the note."""
    at = 1_600_000_000.0
    for i in range(40):  # much to recall about the boat, all of it older than the window
        await _pair(store, f"Osprey log {i}: sanded the hull and varnished the mast.", "Ok.", at)
        at += 10
    await _history(store, rounds=6)
    conv = await store.conversation(KEY)
    older = (await store.all_messages(conv.id))[:100]
    await store.save_summary(
        conv.id, text="Alice worked on her boat.", first_message_id=older[0].id,
        last_message_id=older[-1].id, tokens=6,
    )  # fmt: skip
    layered = LayeredContext(inner=_builder(store, share=0.2), store=store, counter=COUNTER)
    prompts: list[list[ChatMessage]] = []
    for text in ("Alice sails.", " ".join(["Alice keeps a boat called Osprey."] * 26)):
        assert COUNTER.count(text) < layered.reserve(BUDGET)  # both fit the reserve
        await store.save_longterm_summary(
            conv.id, text=text, tokens=COUNTER.count(text), sessions=1,
            up_to_message_id=older[-1].id, updated_at=1.0 + len(prompts),
        )  # fmt: skip
        conv = await store.conversation(KEY)
        ctx = await layered.build(
            conv, new_text="What did I do to the Osprey hull and mast?", new_message_id=None,
            budget=BUDGET,
        )  # fmt: skip
        assert text in ctx.messages[0].content
        assert sum(COUNTER.count(m.content) + MESSAGE_OVERHEAD for m in ctx.messages) <= BUDGET
        prompts.append(ctx.messages)
    short, long = prompts
    assert short[1:-1] == long[1:-1]  # the same window, the same notes
    recalled = [len(re.findall(r"Osprey log \d+", p[-1].content)) for p in prompts]
    assert recalled[0] > recalled[1] + 5, recalled  # the unused reserve held ~40 more lines
