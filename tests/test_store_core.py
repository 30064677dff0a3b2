"""The store core (bot/memory/core): one decision, the same rows on both backends.

The placeholder rewrite and row counts are checked directly; the answer-through-a-link rule
runs on a real SQLite file and a real PostgreSQL server (tests/pg_server.py), the PostgreSQL
run skipped, saying why, only when this machine cannot start a server.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.domain import DM_SPACE, ConversationKey
from bot.memory.core import ddl
from bot.memory.core.db import POSTGRES, SQLITE, changed, numbered
from bot.memory.port import MemoryStore
from bot.memory.records import AlreadyStored, OutboxEntry, StoredAnswer
from bot.memory.store import SqliteStore
from tests import pg_server

MESH = ConversationKey("mesh", "!0000abcd", DM_SPACE)
DISCORD = ConversationKey("discord", "1001", DM_SPACE)


def test_placeholders_are_numbered_outside_string_literals() -> None:
    sql = "SELECT ? FROM t WHERE a = '?' AND b = ? AND c = 'it''s ?' AND d = ?"
    assert numbered(sql) == "SELECT $1 FROM t WHERE a = '?' AND b = $2 AND c = 'it''s ?' AND d = $3"
    assert numbered(sql) is numbered(sql)  # memoised: one dict lookup per query
    assert numbered("SELECT $1") == "SELECT $1"  # already numbered: unchanged


def test_row_counts_from_command_tags() -> None:
    assert (changed("UPDATE 3"), changed("INSERT 0 1"), changed("DELETE 0")) == (3, 1, 0)
    assert changed("CREATE TABLE") == 0


def test_id_lists_per_dialect() -> None:
    assert SQLITE.in_ids("id", [3, 4]) == ("id IN (?,?)", (3, 4))
    assert POSTGRES.in_ids("id", [3, 4]) == ("id = ANY(?::bigint[])", ([3, 4],))


@pytest.fixture(params=["sqlite", "postgres"])
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    if request.param == "sqlite":
        store: MemoryStore = await SqliteStore.open(tmp_path / "core.db")
    else:
        store = await pg_server.open_store()
    yield store
    await store.close()


async def test_an_answer_through_a_link_undone_mid_turn_goes_to_its_own_dm(
    memory: MemoryStore,
) -> None:
    """Asked through the Discord DM linked into the mesh DM; the link is undone before the
    answer is queued: the answer goes to the Discord DM, as the question did."""
    await memory.conversation(MESH)
    await memory.conversation(DISCORD)
    await memory.link_dm(MESH, DISCORD)
    conv = await memory.conversation(DISCORD)
    assert conv.origin_id is not None and conv.key == MESH
    linked = StoredAnswer(conv.id, "bot", "while linked", 2, origin_id=conv.origin_id)
    await memory.queue_delivery(OutboxEntry(DISCORD, "answer", "while linked"), answer=linked)
    home = await memory.all_messages(conv.id)
    assert [(m.text, m.role) for m in home] == [("while linked", "assistant")]
    assert await memory.unlink_dm(DISCORD) == 1  # the answer recorded its origin: it goes back
    late = StoredAnswer(conv.id, "bot", "after unlink", 2, origin_id=conv.origin_id)
    await memory.queue_delivery(OutboxEntry(DISCORD, "answer", "after unlink"), answer=late)
    assert await memory.all_messages(conv.id) == []
    own = await memory.all_messages(conv.origin_id)
    assert [m.text for m in own] == ["while linked", "after unlink"]


def test_shared_migration_text_is_sqlites_to_the_character() -> None:
    """SQLite keeps each table's CREATE text in ``sqlite_master``: the migrations written once
    (``bot.memory.core.ddl``) give SQLite exactly the text its migrations had before."""
    before = {
        ddl.outbox_claims: "e67659276ced25593eee8003699d1adc76b15e57b5e0ea9491c835841338a430",
        ddl.memory_promises: "5a8ac1a21a520f6dd150b038faa04f5850b760d4e1e2001b42e0e95aa09b6896",
    }
    for migration, digest in before.items():
        assert hashlib.sha256(migration(ddl.SQLITE).encode()).hexdigest() == digest
        assert "REAL" not in migration(ddl.POSTGRES)  # PostgreSQL's REAL is 4 bytes


async def test_a_reply_to_a_later_part_of_an_answer_finds_the_answer(memory: MemoryStore) -> None:
    """Discord cuts a long answer into several messages; a reply to the second one has the
    answer as its parent on both backends (PostgreSQL used to find only the first part)."""
    conv = await memory.conversation(MESH)
    question = await memory.add_message(conv.id, role="user", author="ann", text="tell me",
                                        tokens=2, status="pending", platform_id="q1")  # fmt: skip
    answer = StoredAnswer(conv.id, "bot", "a long answer in two parts", 6)
    row = await memory.queue_delivery(
        OutboxEntry(MESH, "answer", "a long answer", question_id=question), answer=answer
    )
    await memory.record_part(row, 0, "part-1")
    await memory.record_part(row, 1, "part-2")
    answer_id = max(m.id for m in await memory.all_messages(conv.id))
    reply = await memory.add_message(conv.id, role="user", author="ann", text="why?",
                                     tokens=1, status="pending", platform_id="q2",
                                     reply_to_platform_id="part-2")  # fmt: skip
    assert [m.id for m in await memory.ancestors(reply, limit=5)] == [answer_id, question]
    again = await memory.add_message(conv.id, role="user", author="ann", text="and?",
                                     tokens=1, status="pending", platform_id="q3",
                                     reply_to_platform_id="nothing-we-sent")  # fmt: skip
    assert await memory.ancestors(again, limit=5) == []


async def test_a_repeat_heard_stores_nothing_and_a_new_id_still_stores(memory: MemoryStore) -> None:
    """The heard check is part of the message's one INSERT: a repeat raises and adds no row,
    on both backends (PostgreSQL's ``heard`` row, SQLite's look at ``messages``)."""
    conv = await memory.conversation(MESH)
    first = await memory.add_message(conv.id, role="user", author="ann", text="hi", tokens=1,
                                     status="pending", platform_id="pkt-1")  # fmt: skip
    with pytest.raises(AlreadyStored):
        await memory.add_message(conv.id, role="user", author="ann", text="hi", tokens=1,
                                 status="pending", platform_id="pkt-1")  # fmt: skip
    answer = await memory.add_message(conv.id, role="assistant", author="bot", text="hello",
                                      tokens=1, status="sent", platform_id="pkt-1",
                                      parent_id=first)  # fmt: skip
    assert [m.id for m in await memory.all_messages(conv.id)] == [first, answer]
    assert await memory.search_terms(conv.id, ["hello", "hi"], after_id=0, before_id=10**12) == [
        [answer],
        [first],
    ]


async def test_postgresql_finds_an_answer_part_by_its_platform_id_through_an_index() -> None:
    """Migration 013 gives PostgreSQL SQLite's index on outbox_parts(platform_id): a reply to a
    later part of an answer is resolved without reading every recorded part."""
    store = await pg_server.open_store()
    try:
        rows = await store._all("SELECT indexdef FROM pg_indexes WHERE tablename = 'outbox_parts'")
        assert any("(platform_id)" in str(r[0]) for r in rows), rows
    finally:
        await store.close()


async def test_postgresql_writes_that_need_no_flush_skip_it_and_are_seen_at_once() -> None:
    """``durable=False`` writes (a question's claim here) go through the pool that commits
    without waiting for the WAL flush; the durable pool keeps the server's default. Another
    gateway sees such a write at once: its own claim of the same question fails."""
    from bot.memory.postgres import PostgresStore

    one = await pg_server.open_store()
    two = await PostgresStore.open(
        one.url, password=pg_server.BOT_PASSWORD, gateway="another-gateway"
    )
    try:
        sql = "SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'"
        durable = await one._run(lambda con: con.fetchrow(sql))
        lazy = await one._run(lambda con: con.fetchrow(sql), durable=False)
        assert lazy is not None and tuple(lazy) == ("off", "client")
        assert (
            durable is not None and durable["source"] != "client"
        )  # the server's own setting (tests: no fsync)
        conv = await one.conversation(MESH)
        qid = await one.add_message(conv.id, role="user", author="alice", text="hi", tokens=1,
                                    status="pending")  # fmt: skip
        assert await one.claim_question(qid, stale_before=0.0)
        assert not await two.claim_question(qid, stale_before=0.0)  # theirs, and fresh
    finally:
        await two.close()
        await one.close()
