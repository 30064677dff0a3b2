"""Recall notes never outlive what they quote (issue 17): a note records the ids of the
messages it quotes, and retention, forgetting by use and ``!unlink`` drop (in the same
transaction) every note that quotes a message gone from its conversation, so no later prompt
shows text that was deleted. Each case runs on SQLite and on a real PostgreSQL, through the
real context builder."""

from __future__ import annotations

import json

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore
from tests.test_recall_notes import (
    KEY,
    _ask,
    _builder,
    _history,
    _pair,
)

BOAT = "Osprey and she is moored"


async def _quotes(store: MemoryStore) -> dict[int, list[int]]:
    """Every kept note: its message id -> the ids it quotes."""
    rows = await store._all(  # type: ignore[attr-defined]
        "SELECT id, recall_ids FROM messages WHERE recall_note IS NOT NULL ORDER BY id"
    )
    return {int(r[0]): json.loads(r[1]) for r in rows}


async def _all_quoted_exist(store: MemoryStore) -> None:
    conv = await store.conversation(KEY)
    here = {m.id for m in await store.all_messages(conv.id)}
    for noted, quoted in (await _quotes(store)).items():
        assert set(quoted) <= here, (noted, quoted)


async def test_retention_drops_the_notes_that_quote_a_pruned_message(
    memory: MemoryStore,
) -> None:
    await _history(memory)  # the details come first, at 1_700_000_000
    builder = _builder(memory)
    _, boat = await _ask(memory, builder, "What is my boat called?", answer="Osprey.")
    # Not a repeat of the stored line (a repeat is not recalled): it only matches it.
    _, solar = await _ask(memory, builder, "Remind me about the solar charge controller "
                          "checks?", answer="Monthly.")  # fmt: skip
    notes = await memory.recall_notes([boat, solar])
    assert BOAT in notes[boat] and BOAT not in notes[solar]
    quotes = await _quotes(memory)
    assert quotes[boat] and quotes[solar]  # each note knows what it quotes

    pruned = await memory.prune_older_than(1_700_000_025.0)  # the three detail pairs
    assert pruned == 6
    after = await memory.recall_notes([boat, solar])
    assert boat not in after  # it quoted the boat's detail: dropped
    assert after[solar] == notes[solar]  # it quoted only what is left: kept as it was
    await _all_quoted_exist(memory)
    # The next prompt shows the turn without the dropped note: nothing deleted reappears.
    messages, _ = await _ask(memory, builder, "thanks!")
    assert BOAT not in "\n".join(m.content for m in messages)


async def test_forgetting_by_use_drops_the_notes_that_quote_a_pruned_message(
    memory: MemoryStore,
) -> None:
    await _history(memory)
    builder = _builder(memory)
    asked = []
    for text in ("What is my boat called?", "Where does my sister Ingrid live?",
                 "Which frequency does the repeater use?"):  # fmt: skip
        asked.append((await _ask(memory, builder, text, answer="ok"))[1])
    before = await _quotes(memory)
    # The boat note's sources are the least used messages: forgetting by use takes them.
    await memory._exec("UPDATE messages SET uses = 10")  # type: ignore[attr-defined]
    await memory._exec(  # type: ignore[attr-defined]
        "UPDATE messages SET uses = 0 WHERE " + " OR ".join(["id = ?"] * len(before[asked[0]])),
        before[asked[0]],
    )
    conv = await memory.conversation(KEY)
    ids_before = {m.id for m in await memory.all_messages(conv.id)}
    assert await memory.prune_by_use(len(ids_before) - len(before[asked[0]])) == len(
        before[asked[0]]
    )
    ids_after = {m.id for m in await memory.all_messages(conv.id)}
    gone = ids_before - ids_after
    stale = {n for n, q in before.items() if n in ids_after and set(q) & gone}
    assert stale  # the case is real: some notes quoted what was pruned
    after = await _quotes(memory)
    assert not stale & set(after)
    assert {n for n in before if n in ids_after} - stale <= set(after)  # the others stay
    await _all_quoted_exist(memory)


async def test_unlink_drops_notes_that_quote_the_other_accounts_words(
    memory: MemoryStore,
) -> None:
    """A note in the home that quotes a message the link brought in is dropped when the
    link is undone: that message went back to its own account."""
    chat = ConversationKey("discord", "1001")
    other = await memory.conversation(chat)
    await memory.add_message(other.id, role="user", author="alice", text="My boat is called "
                             "Osprey and she is moored at the north pier.", tokens=16,
                             status="answered", created_at=1_600_000_000.0)  # fmt: skip
    await _history(memory)
    await memory.link_dm(KEY, chat)
    builder = _builder(memory)
    _, asked = await _ask(memory, builder, "Where is my boat Osprey moored?", answer="ok")
    assert "north pier" in (await memory.recall_notes([asked]))[asked]
    await memory.unlink_dm(chat)
    await _all_quoted_exist(memory)
    note = (await memory.recall_notes([asked])).get(asked, "")
    conv = await memory.conversation(KEY)
    own = [m.text for m in await memory.all_messages(conv.id)]
    assert all(line in "\n".join(own) for line in note.splitlines() if "moored" in line)


async def test_a_note_without_known_sources_is_dropped_when_its_conversation_is_pruned(
    memory: MemoryStore,
) -> None:
    """A note saved before notes recorded their sources may quote anything older: it goes
    when its conversation loses messages."""
    await _history(memory, rounds=1)
    conv = await memory.conversation(KEY)
    asked = await _pair(memory, "old question", "old answer", 1_800_000_000.0)
    await memory.save_recall_note(asked, "(Earlier messages: the boat is Osprey)")
    await memory._exec(  # type: ignore[attr-defined]
        "UPDATE messages SET recall_ids = NULL WHERE id = ?", (asked,)
    )
    await memory.prune_older_than(1_700_000_005.0)
    assert await memory.recall_notes([asked]) == {}
    assert conv.id == (await memory.conversation(KEY)).id


async def test_a_note_quoting_a_message_gone_by_any_path_is_never_read(
    memory: MemoryStore,
) -> None:
    """Reading checks again: a message removed without the cleanup (a path written later, a
    row deleted by hand) cannot bring its text back through a note."""
    await _history(memory)
    _, boat = await _ask(memory, _builder(memory), "What is my boat called?", answer="Osprey.")
    quoted = (await _quotes(memory))[boat]
    await memory._exec("DELETE FROM messages WHERE id = ?", (quoted[0],))  # type: ignore[attr-defined]
    assert await memory.recall_notes([boat]) == {}
    messages, _ = await _ask(memory, _builder(memory), "thanks!")
    assert BOAT not in "\n".join(m.content for m in messages)
