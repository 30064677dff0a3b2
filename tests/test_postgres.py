"""PostgreSQL-only behaviour: several stores (gateways) on one database, word search that
agrees with SQLite's FTS5, privacy on a shared server, the unprivileged role, bad settings.

Every test runs against a real server the suite starts (tests/pg_server.py); each "gateway"
is its own ``PostgresStore`` with its own connections, as a separate process would have.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.errors import StorageError
from bot.memory.open import open_url
from bot.memory.records import SUMMARY_CLAIM, AlreadyStored
from bot.memory.sqlite import SqliteStore
from tests import pg_server

asyncpg = pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")
from bot.memory.postgres import PostgresStore  # noqa: E402 (needs asyncpg, checked above)
from bot.memory.postgres.schema import MIGRATIONS  # noqa: E402

ALICE = ConversationKey("mesh", "!0000abcd")
BOB = ConversationKey("mesh", "!0000beef")


async def _open(url: str) -> PostgresStore:
    return await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)


async def test_two_gateways_store_a_packet_heard_by_both_once(url: str) -> None:
    a, b = await _open(url), await _open(url)
    try:
        ca, cb = await a.conversation(ALICE), await b.conversation(ALICE)
        assert ca.id == cb.id

        async def hear(store: PostgresStore) -> int | None:
            try:
                return await store.add_message(ca.id, role="user", author="alice",
                                               text="hello mesh", tokens=2, status="pending",
                                               platform_id="2471")  # fmt: skip
            except AlreadyStored:
                return None

        results = await asyncio.gather(*(hear(s) for s in (a, b, a, b)))
        assert sum(r is not None for r in results) == 1
        assert [m.text for m in await b.all_messages(ca.id)] == ["hello mesh"]
    finally:
        await a.close()
        await b.close()


async def test_turn_lock_and_claims_hold_across_gateways(url: str) -> None:
    a, b = await _open(url), await _open(url)
    try:
        conv = await a.conversation(ALICE)
        order: list[str] = []
        async with a.turn_lock(conv.id):
            waiting = asyncio.create_task(_hold(b, conv.id, order))
            await asyncio.sleep(0.3)
            assert not waiting.done()  # gateway B waits for A's turn
            order.append("a done")
            async with b.claim(SUMMARY_CLAIM, conv.id) as got_b:
                assert got_b
                async with a.claim(SUMMARY_CLAIM, conv.id) as got_a:
                    assert not got_a
        await asyncio.wait_for(waiting, 30)
        assert order == ["a done", "b turn"]
    finally:
        await a.close()
        await b.close()


async def _hold(store: PostgresStore, cid: int, order: list[str]) -> None:
    async with store.turn_lock(cid):
        order.append("b turn")


async def test_a_crashed_gateway_releases_its_locks(url: str) -> None:
    a, b = await _open(url), await _open(url)
    try:
        conv = await a.conversation(ALICE)
        held = a.turn_lock(conv.id)
        await held.__aenter__()
        await a._locks.close()  # the process dies: its connection, and its locks, go away
        await asyncio.wait_for(_hold(b, conv.id, []), 30)
    finally:
        await a._pool.close()
        await a._lazy.close()
        await b.close()


TEXTS = [
    "Don't e-mail bob@example.com about the 3.5 kg café order!",
    "The runners were running; one runner ran generalizations",
    "Paddling on Lake Mjøsa, naïve résumé, CamelCaseWord",
    "http://radio.example.org/some_path?x=1 and 1,000,000 packets",
    "東京タワー is tall; Ünïcödé and emoji 🚀 too",
    "connections connected connecting: connect",
]
TERMS = [
    "don't", "don", "t", "mail", "e-mail", "bob", "example", "3.5", "5", "cafe", "café",
    "order", "ordering", "run", "runner", "running", "general", "generalization", "mjosa",
    "naive", "resume", "camelcaseword", "http", "some", "path", "some_path", "000", "1,000",
    "東京タワー", "unicode", "emoji", "🚀", "connect", "connection", "alice", "march", "2026",
    "7", "the", "is", "nothing-here",
]  # fmt: skip


async def test_word_search_finds_what_sqlite_finds(url: str, tmp_path: Path) -> None:
    lite = await SqliteStore.open(tmp_path / "m.db")
    pg = await _open(url)
    when = datetime(2026, 3, 7, 12, tzinfo=UTC).timestamp()
    try:
        found = {}
        for store in (lite, pg):
            conv = await store.conversation(ALICE)
            other = await store.conversation(BOB)
            for text in TEXTS:
                await store.add_message(conv.id, role="user", author="alice", text=text,
                                        tokens=5, status="pending", created_at=when)  # fmt: skip
                await store.add_message(other.id, role="user", author="bob", text=text,
                                        tokens=5, status="pending", created_at=when)  # fmt: skip
            hits = await store.search_terms(conv.id, TERMS, after_id=0, before_id=10**9)
            found[type(store).__name__] = {t: sorted(h) for t, h in zip(TERMS, hits, strict=True)}
        assert found["PostgresStore"] == found["SqliteStore"]
        assert found["PostgresStore"]["running"] == [3]  # stems; ids of Alice's rows only
        assert found["PostgresStore"]["march"] == [1, 3, 5, 7, 9, 11]  # the meta line
    finally:
        await lite.close()
        await pg.close()


async def test_forget_leaves_no_row_or_index_entry_behind(url: str) -> None:
    store = await _open(url)
    try:
        conv = await store.conversation(ALICE)
        mid = await store.add_message(conv.id, role="user", author="alice",
                                      text="zanzibar omelette", tokens=2, status="pending",
                                      platform_id="p1")  # fmt: skip
        await store.add_vectors([(mid, conv.id, "m", [1.0, 0.0])])
        await store.add_fact(conv.id, text="likes zanzibar", tokens=2)
        await store.save_summary(conv.id, text="zanzibar talk", first_message_id=mid,
                                 last_message_id=mid, tokens=2)  # fmt: skip
        bob = await store.conversation(BOB)
        await store.add_message(bob.id, role="user", author="bob", text="kept", tokens=1,
                                status="pending")  # fmt: skip
        report = await store.forget_person("mesh", ALICE.person)
        assert (report.conversations, report.messages, report.facts) == (1, 1, 1)
    finally:
        await store.close()
    server = pg_server.shared()
    db = url.split("/")[3].split("?")[0]
    counts = server.psql(
        "SELECT (SELECT count(*) FROM messages WHERE search::text LIKE '%zanzibar%'), "
        "(SELECT count(*) FROM heard), (SELECT count(*) FROM message_vectors), "
        "(SELECT count(*) FROM facts), (SELECT count(*) FROM summaries), "
        "(SELECT count(*) FROM conversations), (SELECT count(*) FROM messages)",
        database=db,
    )
    assert counts.strip() == "0|0|0|0|0|1|1"
    assert "VACUUM" in store.last_erase  # dead row versions and index entries freed too


async def test_the_bot_role_is_no_superuser_and_migrates_once(url: str) -> None:
    stores = await asyncio.gather(*(_open(url) for _ in range(3)))  # gateways starting at once
    try:
        row = await stores[0]._one(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        )
        assert row is not None and tuple(row) == (False, False, False)
        names = await stores[0]._all("SELECT name FROM schema_migrations ORDER BY name")
        assert [r[0] for r in names] == [name for name, _ in MIGRATIONS]
    finally:
        for s in stores:
            await s.close()


async def test_wrong_password_and_missing_variable_say_how_to_fix(url: str) -> None:
    with pytest.raises(StorageError, match="password_env"):
        await PostgresStore.open(url, password="wrong")
    with pytest.raises(StorageError, match="MESHSAGE_PG_PASSWORD, which is not set"):
        await open_url(url, password_env="MESHSAGE_PG_PASSWORD", env={})
    store = await open_url(url, password_env="PW", env={"PW": pg_server.BOT_PASSWORD})
    await store.close()


async def test_unreachable_server_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot reach PostgreSQL"):
        await PostgresStore.open(f"postgresql://meshsage@/x?host={tmp_path}&port=1")


async def test_each_gateway_redelivers_only_its_own_outbox_rows(url: str) -> None:
    from bot.memory.records import OutboxEntry

    a = await PostgresStore.open(url, password=pg_server.BOT_PASSWORD, gateway="north")
    b = await PostgresStore.open(url, password=pg_server.BOT_PASSWORD, gateway="south")
    try:
        mine = await a.queue_delivery(OutboxEntry(ALICE, "answer", "from the north radio"))
        theirs = await b.queue_delivery(OutboxEntry(BOB, "answer", "from the south radio"))
        assert [r.id for r in await a.undelivered(transports=["mesh"])] == [mine]
        assert [r.id for r in await b.undelivered(transports=["mesh"])] == [theirs]
        row = await b.outbox_row(mine)  # any gateway may read a row (e.g. !more)
        assert row is not None and row.entry.text == "from the north radio"
    finally:
        await a.close()
        await b.close()


async def test_operations_and_catch_up_queries(url: str) -> None:
    store = await _open(url)
    try:
        await store.ping()
        conv = await store.conversation(ALICE)
        await store.add_message(conv.id, role="user", author="alice", text="hi", tokens=1,
                                status="pending", platform_id="d-1", created_at=2000.0)  # fmt: skip
        await store.add_message(conv.id, role="assistant", author="bot", text="yo", tokens=1,
                                status="sent", created_at=2001.0)  # fmt: skip
        assert await store.messages_since(1500.0) == {"user": 1, "assistant": 1}
        assert await store.known_platform_ids("mesh", ["d-1", "d-2"], since=1000.0) == {"d-1"}
        assert await store.known_platform_ids("mesh", ["d-1"], since=3000.0) == set()
    finally:
        await store.close()
