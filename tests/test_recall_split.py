"""On a slow server, a recall split into its note and the part shown once shows every turn
retrieval chose (issue 37): the part shown once is packed in the room the whole recall had, so
a day's date line that both parts print does not push a chosen turn out of the prompt, and
the recall stays within its room (``recall_seconds``), that date line aside. Without a limit
the part shown once keeps to what the whole used (the cache-friendly tail, bench.prefix)."""

from __future__ import annotations

from bot.config import RetrievalConfig
from bot.domain import ConversationKey
from bot.llm.tokens import MESSAGE_OVERHEAD, make_counter
from bot.memory.context import MORE_HEADER, RETRIEVED_HEADER, ContextBuilder
from bot.memory.port import MemoryStore
from bot.memory.retrieval import Retriever, day_label, render_turn
from bot.memory.store import StoredMessage

COUNTER = make_counter()
KEY = ConversationKey("console", "alice")
BUDGET = 1536
DAY = 1_700_000_000.0  # every older turn on one day: one date line that both parts print


def _builder(store: MemoryStore, room: int | None = None) -> ContextBuilder:
    return ContextBuilder(
        store=store,
        retriever=Retriever(store=store, counter=COUNTER, config=RetrievalConfig()),
        counter=COUNTER,
        system_prompt="You are a test bot.",
        retrieval_share=0.2,
        recall_room=lambda: room,
    )


async def _say(store: MemoryStore, role: str, text: str, at: float) -> int:
    conv = await store.conversation(KEY)
    author = "alice" if role == "user" else "bot"
    return await store.add_message(conv.id, role=role, author=author, text=text,
                                   tokens=COUNTER.count(text), status="delivered",
                                   created_at=at)  # fmt: skip


async def _history(store: MemoryStore) -> None:
    """Turns about the boat's hull, alike in size, on one day, then small talk on later days
    (the window), so a question about the hull recalls several of them."""
    at = DAY
    for i in range(12):
        await _say(store, "user", f"Osprey hull log {i}: sanded the keel and varnished it.", at)
        await _say(store, "assistant", f"Noted, coat {i} on the keel.", at + 1)
        at += 60
    at += 86400
    for i in range(30):
        await _say(store, "user", f"Any tips for a cold evening on the pier? ({i})", at)
        await _say(store, "assistant", f"A thick lentil soup and a warm jumper. ({i})", at + 1)
        at += 3600


async def _prompt(store: MemoryStore, room: int | None, text: str) -> tuple[str, list[int], int]:
    conv = await store.conversation(KEY)
    mid = await _say(store, "user", text, DAY + 90 * 86400)
    ctx = await _builder(store, room).build(conv, new_text=text, new_message_id=mid, budget=BUDGET)
    assert sum(COUNTER.count(m.content) + MESSAGE_OVERHEAD for m in ctx.messages) <= BUDGET
    recalled = sum(b.tokens for b in ctx.blocks if b.name.startswith("retrieved"))
    return ctx.messages[-1].content, [m.id for m in ctx.retrieved], recalled


def _shown(final: str, turns: list[StoredMessage]) -> list[bool]:
    return [render_turn(m) in final for m in turns]


async def test_on_a_slow_server_every_turn_retrieval_chose_is_in_the_prompt(
    memory: MemoryStore,
) -> None:
    await _history(memory)
    question = "How did I varnish the keel of the Osprey hull?"
    final, ids, _ = await _prompt(memory, 400, question)
    turns = await memory.messages_by_ids(ids)
    assert len(turns) > 4 and RETRIEVED_HEADER in final and MORE_HEADER in final
    assert all(_shown(final, turns)), "a chosen turn left out of the part shown once"
    # Both parts date their turns: the day's line leads each.
    day = day_label(turns[0].created_at)
    note, _sep, once = final.partition(MORE_HEADER)
    assert day in note and day in once


async def test_without_a_limit_the_part_shown_once_stays_within_what_the_whole_used(
    memory: MemoryStore,
) -> None:
    """Where no server speed holds recall (a fast server), the tail a cache cannot keep is
    not made longer than the recall retrieval packed (bench.prefix's share): a turn the
    repeated date line leaves no room for stays out."""
    await _history(memory)
    question = "How did I varnish the keel of the Osprey hull?"
    final, ids, recalled = await _prompt(memory, None, question)
    turns = await memory.messages_by_ids(ids)
    packed = sum(COUNTER.count(render_turn(m)) + 1 for m in turns)
    packed += COUNTER.count(day_label(turns[0].created_at)) + 1  # one day, one date line
    headers = COUNTER.count(RETRIEVED_HEADER) + COUNTER.count(MORE_HEADER) + 4
    assert MORE_HEADER in final and recalled - headers <= packed


async def test_a_held_recall_shows_every_chosen_turn_and_stays_in_its_room(
    memory: MemoryStore,
) -> None:
    """On a slow server (200 tokens of recall: 40 prompt tokens/s for 5 s) every turn chosen
        is shown, and everything recalled stays within the room, its headers and the one date line
    both parts print aside (what the once-only part costs on top, like its header)."""
    await _history(memory)
    room = 200
    final, ids, recalled = await _prompt(memory, room, "How did I varnish the Osprey keel?")
    turns = await memory.messages_by_ids(ids)
    assert len(turns) >= 3
    assert all(_shown(final, turns)), "a chosen turn left out of the part shown once"
    headers = COUNTER.count(RETRIEVED_HEADER) + COUNTER.count(MORE_HEADER) + 4
    again = COUNTER.count(day_label(turns[0].created_at)) + 1
    assert recalled - headers <= room + again
