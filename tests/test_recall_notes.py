"""Recall that answers (issue 17): how much a message recalls, notes kept with their turn in
the store (same prompt after a restart, same prompt on SQLite and PostgreSQL), no repeats, and
the edge cases: no history, small talk, !reset, !forget, incognito (never noted)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from bot.config import RetrievalConfig
from bot.domain import ConversationKey
from bot.llm.port import ChatMessage
from bot.llm.tokens import MESSAGE_OVERHEAD, make_counter
from bot.memory.context import (
    MIN_RECALL_TOKENS,
    MORE_HEADER,
    NOTE_SHARE,
    RETRIEVED_HEADER,
    AssembledContext,
    ContextBuilder,
    recall_weight,
)
from bot.memory.layers import LayeredContext
from bot.memory.older_chapter import CHAPTER_HEADER
from bot.memory.port import MemoryStore
from bot.memory.retrieval import Retriever
from bot.memory.window import day_line
from tests.conftest import STORES

COUNTER = make_counter()
KEY = ConversationKey("console", "alice")
BUDGET = 1536
NOTE_LIMIT = max(NOTE_SHARE * BUDGET, MIN_RECALL_TOKENS) + 16  # a note's turns and its header
FILLER = [
    ("Any tips for keeping batteries warm in winter?", "Insulate the box and keep it dry."),
    ("How often should I check the solar charge controller?", "Once a month is plenty."),
    ("What makes LoRa work so well over long distances?", "Chirp spread spectrum."),
    ("Can you suggest a simple dinner for a cold evening?", "A thick lentil soup."),
]
DETAILS = [
    ("My boat is called Osprey and she is moored at the north pier.", "Lovely name."),
    ("My sister Ingrid lives in Bergen and works as a nurse.", "Good to know."),
    ("I run the repeater on Mount Storsteinen at 433 MHz.", "Nice site."),
]


def _builder(store: MemoryStore, share: float = 0.4) -> ContextBuilder:
    """A builder as app.py wires it; a new one stands for a restarted process."""
    return ContextBuilder(
        store=store,
        retriever=Retriever(store=store, counter=COUNTER, config=RetrievalConfig()),
        counter=COUNTER,
        system_prompt="You are a test bot.",
        retrieval_share=share,
    )


async def _pair(store: MemoryStore, q: str, a: str, at: float) -> int:
    conv = await store.conversation(KEY)
    qid = await store.add_message(conv.id, role="user", author="alice", text=q,
                                  tokens=COUNTER.count(q), status="answered",
                                  created_at=at)  # fmt: skip
    await store.add_message(conv.id, role="assistant", author="bot", text=a,
                            tokens=COUNTER.count(a), status="delivered", created_at=at + 1,
                            parent_id=qid)  # fmt: skip
    return qid


async def _history(store: MemoryStore, rounds: int = 12) -> None:
    """Details early, then enough small talk that they are far out of the window."""
    at = 1_700_000_000.0
    for q, a in DETAILS:
        await _pair(store, q, a, at)
        at += 10
    for i in range(8):  # much to recall about the boat
        await _pair(store, f"Osprey log {i}: sanded and varnished the hull, {i} coats.", "Ok.", at)
        at += 10
    for i in range(rounds):
        for q, a in FILLER:
            await _pair(store, f"{q} ({i})", f"{a} ({i})", at)
            at += 10


async def _ask(
    store: MemoryStore, builder: ContextBuilder, text: str, *, answer: str | None = None
) -> tuple[list[ChatMessage], int]:
    """Store the message, build its prompt (saving its note), store an answer."""
    conv = await store.conversation(KEY)
    mid = await store.add_message(conv.id, role="user", author="alice", text=text,
                                  tokens=COUNTER.count(text), status="pending")  # fmt: skip
    ctx = await builder.build(conv, new_text=text, new_message_id=mid, budget=BUDGET)
    assert sum(COUNTER.count(m.content) + MESSAGE_OVERHEAD for m in ctx.messages) <= BUDGET
    if answer is not None:
        await store.add_message(conv.id, role="assistant", author="bot", text=answer,
                                tokens=COUNTER.count(answer), status="delivered",
                                parent_id=mid)  # fmt: skip
    return ctx.messages, mid


def _recalled(messages: list[ChatMessage]) -> str:
    final = messages[-1].content
    return final.split(RETRIEVED_HEADER, 1)[1] if RETRIEVED_HEADER in final else ""


def test_recall_weight_ramps_from_small_talk_to_strong_matches() -> None:
    assert recall_weight(0.0) == 0.0 and recall_weight(0.25) == 0.0
    assert 0.0 < recall_weight(0.4) < 1.0
    assert recall_weight(0.5) == 1.0 and recall_weight(3.0) == 1.0


async def test_strong_question_recalls_more_than_the_old_cap_small_talk_nothing(
    memory: MemoryStore,
) -> None:
    await _history(memory)
    builder = _builder(memory)
    none, _ = await _ask(memory, builder, "Any plans for the weekend?", answer="Not yet.")
    assert _recalled(none) == ""  # nothing matches: nothing recalled
    # A strong but partial match (no one turn holds every word): the wide net, more than
    # the 10% per turn notes were capped at before.
    strong, _ = await _ask(
        memory,
        builder,
        "Where is Osprey moored, and how many coats of varnish did the hull get?",
        answer="North.",
    )
    recalled = _recalled(strong)
    assert "north pier" in recalled and "varnished the hull" in recalled
    assert COUNTER.count(recalled) > 0.1 * (BUDGET - 20)
    # A complete match (one turn holds every word): that turn, and not the wide net; the room
    # the window leaves goes only to turns that hold the message's words themselves ("Osprey"),
    # in the part shown this once, never in the note.
    sure, _ = await _ask(memory, builder, "Where is my boat Osprey moored?", answer="North.")
    note, _sep, once = _recalled(sure).partition(MORE_HEADER)
    assert "north pier" in note and "varnished" not in note
    said = [line for line in once.splitlines() if line.startswith("alice:")]
    assert said and all("Osprey" in line for line in said)
    # ... small talk that matches weakly ("good" in "Good to know.") gets little.
    small, _ = await _ask(memory, builder, "Good morning, how are you today?")
    assert COUNTER.count(_recalled(small)) < COUNTER.count(recalled) / 2


async def test_a_large_recall_is_shown_once_its_note_stays_and_leads(memory: MemoryStore) -> None:
    """The recall's best part is the turn's note and leads the final message; the rest follows
    it this once. The next prompt holds the note at that turn (the same leading text, so a
    cache keeps it) and not the rest."""
    await _history(memory)
    builder = _builder(memory)
    question = "Where is Osprey moored, and how many coats of varnish did the hull get?"
    first, mid = await _ask(memory, builder, question, answer="North.")
    note = (await memory.recall_notes([mid]))[mid]
    final = first[-1].content
    assert note and final.startswith(note + "\n\n" + MORE_HEADER)
    rest = final[len(note) :]
    assert "varnished the hull" in rest and question in rest
    nxt, _ = await _ask(memory, builder, "thanks!")
    asked = next(m.content for m in nxt if m.role == "user" and question in m.content)
    # The note stays with its turn, the rest is gone; the turn's date line (its day is not
    # the previous turn's) follows the note in both prompts, as the final message had it.
    [stored] = await memory.messages_by_ids([mid])
    dated = day_line(stored.created_at) + "\n" + question
    assert final.endswith("\n\n" + dated)
    assert asked == note + "\n\n" + dated
    assert MORE_HEADER not in "\n".join(m.content for m in nxt)


async def test_a_history_where_every_turn_matches_recalls_nothing_of_it(
    memory: MemoryStore,
) -> None:
    """A phrase the person repeats (and the answers to it) is not recalled for that phrase and
    does not count as a match: the message gets no recall; a real question still does."""
    await _history(memory, rounds=2)
    at = 1_700_100_000.0
    for i in range(40):
        await _pair(memory, "good morning mesh, quiet night on the repeater", f"Morning! ({i})", at)
        at += 10
    builder = _builder(memory)
    again, _ = await _ask(memory, builder, "good morning mesh, quiet night on the repeater!")
    assert _recalled(again) == ""
    asked, _ = await _ask(memory, builder, "Which frequency does my repeater on Storsteinen use?")
    assert "433 MHz" in _recalled(asked)


async def test_note_is_stored_with_its_turn_and_a_restart_sends_the_same_prompt(
    memory: MemoryStore,
) -> None:
    await _history(memory)
    builder = _builder(memory)
    _, asked = await _ask(memory, builder, "What is my boat called?", answer="Osprey.")
    note = (await memory.recall_notes([asked]))[asked]
    assert "Osprey and she is moored" in note
    assert COUNTER.count(note) <= NOTE_LIMIT  # the best part only
    conv = await memory.conversation(KEY)
    nid = await memory.add_message(conv.id, role="user", author="alice", text="thanks!",
                                   tokens=2, status="pending")  # fmt: skip
    same = await builder.build(conv, new_text="thanks!", new_message_id=nid, budget=BUDGET)
    restarted = await _builder(memory).build(
        conv, new_text="thanks!", new_message_id=nid, budget=BUDGET
    )
    assert restarted.messages == same.messages
    window = "\n".join(m.content for m in same.messages[1:-1])
    assert "Osprey and she is moored" in window  # the note rides with its turn


async def prompts_on_both(
    tmp_path: Path, history: Callable[[MemoryStore], Awaitable[object]], questions: Sequence[str]
) -> list[list[list[ChatMessage]]]:
    """The prompts each store (SQLite, then PostgreSQL) sends for ``questions`` asked in turn
    after the same ``history``."""
    prompts = []
    for name in sorted(STORES):
        store = await STORES[name](tmp_path / name if name == "sqlite" else tmp_path)
        try:
            await history(store)
            builder = _builder(store)
            sent = []
            for text in questions:
                messages, _ = await _ask(store, builder, text, answer="ok")
                sent.append(messages)
            prompts.append(sent)
        finally:
            await store.close()
    return prompts


async def test_sqlite_and_postgres_send_the_same_prompt(tmp_path: Path) -> None:
    questions = ("Where does Ingrid live?", "nice weather today", "Which frequency?")
    prompts = await prompts_on_both(tmp_path, _history, questions)
    assert prompts[0] == prompts[1]


async def test_no_history_and_a_question_right_after_a_restart(memory: MemoryStore) -> None:
    messages, _ = await _ask(memory, _builder(memory), "What is my boat called?")
    assert _recalled(messages) == ""  # nothing to recall, nothing breaks
    await _history(memory)
    messages, _ = await _ask(memory, _builder(memory), "What is my boat called?")
    assert "Osprey" in _recalled(messages)


async def test_a_turn_already_noted_is_not_recalled_again(memory: MemoryStore) -> None:
    await _history(memory)
    builder = _builder(memory)
    _, first = await _ask(memory, builder, "What is my boat called?", answer="Osprey.")
    assert "Osprey and she is moored" in (await memory.recall_notes([first]))[first]
    again, _ = await _ask(memory, builder, "Tell me about my boat Osprey again")
    assert "Osprey and she is moored" not in _recalled(again)  # the window's note has it
    assert "Osprey and she is moored" in "\n".join(m.content for m in again)


async def test_reset_hides_notes_and_everything_before(memory: MemoryStore) -> None:
    await _history(memory)
    builder = _builder(memory)
    await _ask(memory, builder, "What is my boat called?", answer="Osprey.")
    conv = await memory.conversation(KEY)
    await memory.reset(conv.id)
    messages, _ = await _ask(memory, builder, "What is my boat called?")
    assert "Osprey" not in "\n".join(m.content for m in messages)


async def test_forget_deletes_the_notes_with_the_turns(memory: MemoryStore) -> None:
    await _history(memory)
    _, asked = await _ask(memory, _builder(memory), "What is my boat called?", answer="Osprey.")
    assert await memory.recall_notes([asked])
    await memory.forget_person(KEY.transport, KEY.person)
    assert await memory.recall_notes([asked]) == {}


async def test_incognito_turns_are_never_noted(memory: MemoryStore) -> None:
    await _history(memory)
    conv = await memory.conversation(KEY)
    layered = LayeredContext(inner=_builder(memory), store=memory, counter=COUNTER)
    ctx = await layered.build(
        conv,
        new_text="What is my boat called?",
        new_message_id=None,  # incognito: the message is not stored
        budget=BUDGET,
        ephemeral=[("person", "my secret is 4242"), ("you", "ok")],
    )
    assert "Osprey" in ctx.messages[-1].content
    ids = [m.id for m in await memory.all_messages(conv.id)]
    assert await memory.recall_notes(ids) == {}


async def test_a_fold_on_the_same_turn_as_a_large_recall(memory: MemoryStore) -> None:
    """The turn that completes a fold block recalls a lot: the prompt stays in budget, its note
    is only the best part, the chapter is asked for right away, and the next prompt (chapter
    written) keeps the window's notes and stays in budget."""
    await _history(memory, rounds=3)
    builder = _builder(memory)
    conv = await memory.conversation(KEY)
    for i in range(60):
        text = f"Tell me again about the Osprey hull and its coats of varnish ({i})"
        mid = await memory.add_message(conv.id, role="user", author="alice", text=text,
                                       tokens=COUNTER.count(text), status="pending")  # fmt: skip
        ctx = await builder.build(conv, new_text=text, new_message_id=mid, budget=BUDGET)
        assert ctx.tokens <= BUDGET
        answer = "She has four coats now. " * 4
        await memory.add_message(conv.id, role="assistant", author="bot", text=answer,
                                 tokens=COUNTER.count(answer), status="delivered",
                                 parent_id=mid)  # fmt: skip
        recalled = sum(b.tokens for b in ctx.blocks if b.name.startswith("retrieved"))
        if ctx.pending_fold is not None and recalled > NOTE_LIMIT:
            break
    else:
        raise AssertionError("no turn both completed a fold block and recalled a lot")
    note = (await memory.recall_notes([mid]))[mid]
    assert COUNTER.count(note) <= NOTE_LIMIT
    assert MORE_HEADER not in note and CHAPTER_HEADER not in note  # the tail is never kept
    chapters = await memory.summaries(conv)
    first = chapters[-1].last_message_id + 1 if chapters else 1
    await memory.save_summary(conv.id, text="They talked about the boat Osprey.",
                              first_message_id=first, last_message_id=ctx.pending_fold - 1,
                              tokens=8)  # fmt: skip
    text = "and the mast?"
    nid = await memory.add_message(conv.id, role="user", author="alice", text=text,
                                   tokens=COUNTER.count(text), status="pending")  # fmt: skip
    after = await builder.build(conv, new_text=text, new_message_id=nid, budget=BUDGET)
    assert after.tokens <= BUDGET
    assert after.window[0].id == ctx.pending_fold  # one change: the chapter and the window
    notes = await memory.recall_notes([m.id for m in after.window])
    window = "\n".join(m.content for m in after.messages[1:])
    assert all(n in window for n in notes.values())  # the notes ride with their turns


async def test_a_slow_server_gets_only_the_recall_it_reads_in_recall_seconds(
    memory: MemoryStore,
) -> None:
    """The person waits for every recalled token the server reads: with a learned room of 100
    tokens the whole recall (note, the part shown once, an older chapter) stays within it, the
    best turn still comes, and the window is the same as without a limit (fold points never
    depend on recall)."""
    await _history(memory)
    question = "Where is Osprey moored, and how many coats of varnish did the hull get?"
    conv = await memory.conversation(KEY)
    mid = await memory.add_message(conv.id, role="user", author="alice", text=question,
                                   tokens=COUNTER.count(question), status="pending")  # fmt: skip
    free = await _builder(memory).build(conv, new_text=question, new_message_id=mid, budget=BUDGET)
    room = 100
    slow = ContextBuilder(
        store=memory,
        retriever=Retriever(store=memory, counter=COUNTER, config=RetrievalConfig()),
        counter=COUNTER,
        system_prompt="You are a test bot.",
        retrieval_share=0.4,
        recall_room=lambda: room,
    )
    held = await slow.build(conv, new_text=question, new_message_id=mid, budget=BUDGET)

    def recalled(ctx: AssembledContext) -> int:
        return sum(b.tokens for b in ctx.blocks if b.name.startswith(("retrieved", "chapter")))

    assert recalled(free) > 3 * room  # without a limit this question recalls far more
    headers = COUNTER.count(RETRIEVED_HEADER) + COUNTER.count(MORE_HEADER) + 8
    # (issue 37: the part shown once repeats the date line of a day it shares with the note,
    # on top of the room, like its header, rather than leave a chosen turn out)
    headers += 2 * (COUNTER.count(day_line(1_700_000_000)) + 1)
    assert 0 < recalled(held) <= room + headers
    assert "varnished the hull" in _recalled(held.messages)  # the best turns still come
    assert [m.id for m in held.window] == [m.id for m in free.window]
    # The learned room is never below a turn or two, however slow the server.
    room = 1
    tiny = await slow.build(conv, new_text=question, new_message_id=mid, budget=BUDGET)
    assert 0 < recalled(tiny) <= MIN_RECALL_TOKENS + headers
