"""Contract suite for what several gateways need from the memory port (messages heard twice,
a conversation's turn lock and claims on derived work: the ``Claims`` Protocol, each gateway's
own outbox rows), run against every implementation in
``test_store_contract.IMPLEMENTATIONS``."""

from __future__ import annotations

import asyncio

import pytest

from bot.memory.port import MemoryStore
from bot.memory.records import HEARD_WINDOW_SECONDS, SUMMARY_CLAIM, AlreadyStored
from tests.test_store_contract import ALICE, BOB


async def _hear(m: MemoryStore, cid: int, text: str, pid: str, at: float = 1_000_000.0) -> int:
    return await m.add_message(cid, role="user", author="alice", text=text, tokens=1,
                               status="pending", platform_id=pid, created_at=at)  # fmt: skip


async def test_a_message_heard_twice_is_stored_once(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    first = await _hear(memory, conv.id, "hello", "pkt-7")
    with pytest.raises(AlreadyStored):
        await _hear(memory, conv.id, "hello", "pkt-7", at=1_000_030.0)
    assert [m.id for m in await memory.all_messages(conv.id)] == [first]
    # Another person may use the same platform id; so may the bot's own answer.
    bob = await memory.conversation(BOB)
    await _hear(memory, bob.id, "hi", "pkt-7")
    await memory.add_message(conv.id, role="assistant", author="bot", text="hi", tokens=1,
                             status="sending", platform_id="pkt-7")  # fmt: skip
    assert await memory.count_messages(conv.id) == 2


async def test_an_id_heard_again_long_after_is_a_new_message(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    await _hear(memory, conv.id, "one", "pkt-1")
    await _hear(memory, conv.id, "two", "pkt-1", at=1_000_000.0 + HEARD_WINDOW_SECONDS + 1)
    assert [m.text for m in await memory.all_messages(conv.id)] == ["one", "two"]


async def test_concurrent_duplicates_store_exactly_one(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    results = await asyncio.gather(
        *(_hear(memory, conv.id, "same packet", "pkt-9") for _ in range(4)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, int) for r in results) == 1
    assert sum(isinstance(r, AlreadyStored) for r in results) == 3
    assert await memory.count_messages(conv.id) == 1


async def test_turn_lock_admits_one_holder_per_conversation(memory: MemoryStore) -> None:
    a, b = await memory.conversation(ALICE), await memory.conversation(BOB)
    inside: list[int] = []
    overlap: list[int] = []

    async def turn(cid: int) -> None:
        async with memory.turn_lock(cid):
            overlap.append(inside.count(cid))
            inside.append(cid)
            await asyncio.sleep(0.01)
            inside.remove(cid)

    await asyncio.gather(*(turn(a.id) for _ in range(3)), turn(b.id))
    assert overlap == [0, 0, 0, 0]
    # Another conversation is not held up by Alice's turns.
    async with memory.turn_lock(a.id):
        await asyncio.wait_for(turn(b.id), 30)


async def test_claim_goes_to_one_holder_and_is_released(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    async with memory.claim(SUMMARY_CLAIM, conv.id) as first:
        async with memory.claim(SUMMARY_CLAIM, conv.id) as second:
            assert (first, second) == (True, False)
        bob = await memory.conversation(BOB)
        async with memory.claim(SUMMARY_CLAIM, bob.id) as other:
            assert other
    async with memory.claim(SUMMARY_CLAIM, conv.id) as again:
        assert again


async def test_concurrent_claims_of_one_outbox_row_have_one_winner(memory: MemoryStore) -> None:
    from bot.memory.records import OutboxEntry

    oid = await memory.queue_delivery(OutboxEntry(ALICE, "answer", "once"))
    results = await asyncio.gather(*(memory.claim_delivery(oid) for _ in range(6)))
    assert sum(r is not None for r in results) == 1


async def test_two_postgres_gateways_claiming_the_same_row_one_wins() -> None:
    """Two gateway processes (two stores, two pools) on one PostgreSQL database race for a row
    many times over: each time exactly one claim succeeds."""
    from bot.memory.postgres import PostgresStore
    from bot.memory.records import OutboxEntry
    from tests import pg_server

    first = await pg_server.open_store()
    second = await PostgresStore.open(first.url, password=pg_server.BOT_PASSWORD, gateway="other")
    try:
        for i in range(20):
            oid = await first.queue_delivery(OutboxEntry(ALICE, "answer", f"row {i}"))
            a, b = await asyncio.gather(first.claim_delivery(oid), second.claim_delivery(oid))
            assert (a is None) != (b is None), f"row {i}: {a!r} {b!r}"
    finally:
        await second.close()
        await first.close()


async def test_each_postgres_gateway_counts_its_own_rows_and_sees_the_others() -> None:
    from bot.memory.postgres import PostgresStore
    from bot.memory.records import OutboxEntry
    from tests import pg_server

    first = await pg_server.open_store()
    second = await PostgresStore.open(first.url, password=pg_server.BOT_PASSWORD, gateway="other")
    try:
        await first.queue_delivery(OutboxEntry(ALICE, "answer", "mine"))
        await second.queue_delivery(OutboxEntry(BOB, "answer", "theirs"))
        await second.queue_delivery(OutboxEntry(BOB, "notice", "theirs too"))
        assert {s: n for s, (n, _) in (await first.outbox_by_state()).items()} == {"pending": 1}
        assert {s: n for s, (n, _) in (await second.outbox_by_state()).items()} == {"pending": 2}
        [(name, at)] = await first.outbox_gateways(since=0.0)
        assert name == "other" and at > 0
        assert [n for n, _ in await second.outbox_gateways(since=0.0)] == [first.gateway]
        assert await first.outbox_gateways(since=at) == []  # nothing newer than its last row
    finally:
        await second.close()
        await first.close()
