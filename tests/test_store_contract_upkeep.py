"""Contract suite for the ``Upkeep`` and ``Movable`` Protocols (bot.memory.port_upkeep):
forgetting and pruning, counts, a person's export/import, and the table-by-table copy of
``migrate-store``. Every test runs on SQLite and PostgreSQL (the ``memory`` fixture,
tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from bot.domain import ConversationKey
from bot.memory.move import DERIVED
from bot.memory.port import MemoryStore
from bot.memory.store import SqliteStore
from tests import pg_server
from tests.test_store_contract import ALICE, BOB, IMPLEMENTATIONS, _say


async def _empty_like(memory: MemoryStore, tmp_path: Path) -> MemoryStore:
    """A new, empty store of the same backend as ``memory``."""
    if isinstance(memory, SqliteStore):
        return await SqliteStore.open(tmp_path / "copy.db")
    return await pg_server.open_store()


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


async def test_a_store_answers_a_ping_tidies_and_counts_the_days_messages(
    memory: MemoryStore,
) -> None:
    await memory.ping()
    conv = await memory.conversation(ALICE)
    for role, at in (("user", 1000.0), ("assistant", 1001.0), ("user", 5000.0)):
        await memory.add_message(conv.id, role=role, author="a", text="x", tokens=1,
                                 status="answered", created_at=at)  # fmt: skip
    await memory.tidy()
    assert await memory.messages_since(1000.0) == {"user": 2, "assistant": 1}
    assert await memory.messages_since(1001.5) == {"user": 1}
    assert await memory.messages_since(9000.0) == {}
    assert len(await memory.all_messages(conv.id)) == 3  # tidy changes no row


async def test_rows_copied_table_by_table_keep_their_ids(
    memory: MemoryStore, tmp_path: Path
) -> None:
    """What ``migrate-store`` does, step by step: mark the copy unfinished, copy rows with
    their ids (the destination derives its own columns), set a reference afterwards, finish
    (new rows get new ids), clear the mark; an unfinished copy is emptied to start over."""
    q = await _say(memory, ALICE, "copied with its id")
    conv = await memory.conversation(ALICE)
    assert "text" in await memory.table_columns("messages")
    assert await memory.table_columns("no_such_table") == []
    dest = await _empty_like(memory, tmp_path)
    try:
        assert not await dest.copy_unfinished()
        await dest.mark_copy(unfinished=True)
        assert await dest.copy_unfinished()
        for table in ("conversations", "messages"):
            have = set(await dest.table_columns(table))
            cols = tuple(c for c in await memory.table_columns(table)
                         if c in have and c not in DERIVED)  # fmt: skip
            rows = await memory.export_rows(table, "id", cols, after=0, limit=100)
            assert await memory.export_rows(table, "id", cols, after=10**9, limit=100) == []
            await dest.import_rows(table, cols, rows)
            assert await dest.count_rows(table) == await memory.count_rows(table) == 1
        await dest.update_rows("conversations", "id", "reset_after", [(conv.id, q)])
        await dest.finish_import()
        await dest.mark_copy(unfinished=False)
        assert not await dest.copy_unfinished()
        assert [(m.id, m.text) for m in await dest.all_messages(conv.id)] == [
            (q, "copied with its id")
        ]
        assert (await dest.conversation(ALICE)).reset_after == q
        assert await dest.search_terms(conv.id, ["copied"], after_id=0, before_id=10**9) == [[q]]
        assert await _say(dest, BOB, "new after the copy") > q
        await dest.empty_tables(["messages", "conversations"])
        assert await dest.count_rows("messages") == await dest.count_rows("conversations") == 0
    finally:
        await dest.close()
