"""The word lookup's plan on PostgreSQL (schema 009_pg_word_index), at a size where the planner
has real choices: many conversations whose rows are interleaved over the table, as in a live
log. Guards what made a turn slow before: a sequential scan, a walk of the messages primary
key, or reading the messages heap for every match of a single word.

Also checks that ``message_words`` stays exactly what ``messages.search`` says through every
write path (insert, import, re-keying a linked DM, forget, retention).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from bot.domain import ConversationKey
from tests import pg_server

asyncpg = pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")
from bot.memory.postgres import PostgresStore  # noqa: E402 (needs asyncpg, checked above)
from bot.memory.postgres.search import _TERM_SQL  # noqa: E402

CONVERSATIONS = 400
MESSAGES = 60_000  # interleaved: conversation = row number mod CONVERSATIONS


async def _open(url: str) -> PostgresStore:
    return await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)


async def _fill(store: PostgresStore, url: str) -> None:
    """MESSAGES rows over CONVERSATIONS conversations through the real schema (triggers fill
    ``message_words``), then VACUUM ANALYZE from another backend, as autovacuum does after a
    bulk load (it sets the visibility map that lets index-only scans skip the heap)."""
    async with store._atomic() as tx:  # flushed at commit: the test server's default is async
        con = tx.con
        await con.execute("SET LOCAL synchronous_commit = on")  # (VACUUM skips unflushed rows)
        await con.execute(
            "INSERT INTO conversations (transport, person, space, created_at) "
            "SELECT 'mesh', 'p' || g, 'dm', 0 FROM generate_series(1, $1) g",
            CONVERSATIONS,
        )
        await con.execute(
            "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens, "
            "status, search) SELECT c, 'user', 'a', t, 0, 5, 'sent', "
            "meshsage_keyed(c, to_tsvector('meshsage', t)) FROM ("
            "  SELECT g % $2 + 1 AS c, 'common words about topic' || (g % 97) || ' and thing' "
            "  || (g % 13) || ' said plainly' AS t FROM generate_series(1, $1) g) s",
            MESSAGES,
            CONVERSATIONS,
        )
    pg_server.shared().psql("VACUUM ANALYZE message_words; VACUUM ANALYZE messages",
                            database=url.split("/")[3].split("?")[0])  # fmt: skip


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _plan(store: PostgresStore, terms: list[str], *, generic: bool) -> list[dict[str, Any]]:
    """Every node of the plan the store's own query gets, as a prepared statement would run
    it (custom plan first; asyncpg's cached statements switch to a generic plan later)."""

    async def work(con: Any) -> list[dict[str, Any]]:
        async with con.transaction():
            mode = "force_generic_plan" if generic else "force_custom_plan"
            await con.execute(f"SET LOCAL plan_cache_mode = {mode}")
            stmt = await con.prepare("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _TERM_SQL)
            raw = await stmt.fetchval(list(range(len(terms))), terms, 7, 0, (1 << 63) - 1, 5000)
        doc = json.loads(raw) if isinstance(raw, str) else raw
        return list(_nodes(doc[0]["Plan"]))

    return await store._run(work)


async def test_word_lookup_is_index_only_and_never_walks_messages(url: str) -> None:
    """Both plans a prepared statement can get, on one filled database (EXPLAIN ANALYZE only
    reads it): the custom plan of its first runs and the generic plan asyncpg's cached
    statements switch to later. Each is checked on its own; a failure names the plan."""
    store = await _open(url)
    try:
        await _fill(store, url)
        plans = {
            mode: (
                await _plan(store, ["common", "topic5", "thing"], generic=mode == "generic"),
                await _plan(store, ["said plainly", "topic5 and"], generic=mode == "generic"),
            )
            for mode in ("custom", "generic")
        }
    finally:
        await store.close()
    for mode, (one_word, phrase) in plans.items():
        _index_only(one_word, phrase, mode)


def _index_only(one_word: list[dict[str, Any]], phrase: list[dict[str, Any]], mode: str) -> None:
    for nodes in (one_word, phrase):
        kinds = {n["Node Type"] for n in nodes}
        assert "Seq Scan" not in kinds, (mode, nodes)
        words = [n for n in nodes if n.get("Relation Name") == "message_words"]
        assert words and all(n["Node Type"] == "Index Only Scan" for n in words), (mode, words)
        assert all("conversation_id" in n["Index Cond"] and "word" in n["Index Cond"]
                   for n in words), mode  # fmt: skip
        for n in nodes:  # the messages table only by primary key, one row per candidate
            if n.get("Relation Name") == "messages":
                assert n["Node Type"] == "Index Scan" and "(id = " in n["Index Cond"], (mode, n)
    # Single words never touch the messages table, and every match comes from the index alone.
    assert all(n["Actual Loops"] == 0 for n in one_word if n.get("Relation Name") == "messages"), (
        mode
    )
    words = [n for n in one_word if n.get("Relation Name") == "message_words"]
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in words) > 0, mode
    assert all(n["Heap Fetches"] == 0 for n in words), (mode, words)


async def _words_match_search(store: PostgresStore) -> None:
    """``message_words`` holds exactly the words of every message's ``search``, unkeyed."""
    rows = await store._all(
        "WITH want AS (SELECT m.conversation_id, regexp_replace(l, '^[0-9]+_', '') AS word, "
        "m.id AS message_id FROM messages m, unnest(tsvector_to_array(m.search)) l) "
        "SELECT (SELECT count(*) FROM (SELECT * FROM want EXCEPT SELECT * FROM message_words) a),"
        " (SELECT count(*) FROM (SELECT * FROM message_words EXCEPT SELECT * FROM want) b),"
        " (SELECT count(*) FROM message_words)"
    )
    missing, extra, total = rows[0]
    assert (missing, extra) == (0, 0)
    assert total > 0 or not await store._val("SELECT count(*) FROM messages")


async def test_word_table_follows_every_write(url: str) -> None:
    store = await _open(url)
    alice = ConversationKey("mesh", "!0000abcd")
    alice_discord = ConversationKey("discord", "alice#1")
    bob = ConversationKey("mesh", "!0000beef")
    try:
        a = await store.conversation(alice)
        b = await store.conversation(bob)
        for i in range(5):
            await store.add_message(a.id, role="user", author="alice", text=f"zebra stripes {i}",
                                    tokens=2, status="pending")  # fmt: skip
            await store.add_message(b.id, role="user", author="bob", text=f"zebra crossing {i}",
                                    tokens=2, status="pending")  # fmt: skip
        await _words_match_search(store)
        d = await store.conversation(alice_discord)
        await store.add_message(d.id, role="user", author="alice", text="giraffe necks",
                                tokens=2, status="pending")  # fmt: skip
        assert await store.link_dm(alice, alice_discord) == 1  # re-keys the absorbed DM's words
        await _words_match_search(store)
        home = await store.conversation(alice)
        hits = await store.search_terms(home.id, ["giraffe", "zebra"], after_id=0,
                                        before_id=10**9)  # fmt: skip
        assert len(hits[0]) == 1 and len(hits[1]) == 5
        assert await store.unlink_dm(alice_discord) == 1  # and gives them back
        await _words_match_search(store)
        assert await store.link_dm(alice, alice_discord) == 1
        await store.forget_person("mesh", bob.person)
        await _words_match_search(store)
        assert not await store._val(
            "SELECT count(*) FROM message_words WHERE conversation_id = $1", (b.id,)
        )
    finally:
        await store.close()


async def test_an_existing_database_gets_its_words_at_upgrade(url: str) -> None:
    """A database written before 009_pg_word_index: the migration fills ``message_words`` from
    the stored words, and search then finds what it found before."""
    from bot.memory.postgres.schema import MIGRATIONS, migrate

    before = [m for m in MIGRATIONS if m[0] < "009"]
    con = await asyncpg.connect(url, password=pg_server.BOT_PASSWORD)
    try:
        await migrate(con, before)
        await con.execute(
            "INSERT INTO conversations (transport, person, space, created_at) "
            "VALUES ('mesh', 'a', 'dm', 0), ('mesh', 'b', 'dm', 0)"
        )
        await con.execute(
            "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens, "
            "status, search) SELECT c, 'user', 'x', t, 0, 1, 'sent', "
            "meshsage_keyed(c, to_tsvector('meshsage', t)) FROM (VALUES (1, 'running dogs'), "
            "(2, 'running cats'), (1, 'quiet evening')) v(c, t)"
        )
    finally:
        await con.close()
    store = await _open(url)  # applies 009 to the existing rows
    try:
        await _words_match_search(store)
        assert await store.search_terms(1, ["run", "cats", "evening"], after_id=0,
                                        before_id=10**9) == [[1], [], [3]]  # fmt: skip
    finally:
        await store.close()
