"""The store core (bot/memory/core): one decision, the same rows on both backends.

The placeholder rewrite and row counts are checked directly; the answer-through-a-link rule
runs on a real SQLite file and a real PostgreSQL server (tests/pg_server.py), the PostgreSQL
run skipped, saying why, only when this machine cannot start a server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.domain import DM_SPACE, ConversationKey
from bot.memory.core.db import POSTGRES, SQLITE, changed, numbered
from bot.memory.port import MemoryStore
from bot.memory.records import OutboxEntry, StoredAnswer
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
