"""Contract suite for the vector part of the ``Recall`` Protocol (bot.memory.port_recall;
used by memory.embeddings), run against every implementation in
``test_store_contract.IMPLEMENTATIONS``."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore
from tests.test_store_contract import ALICE, BOB, IMPLEMENTATIONS

M = "test-model"
TOP = 10**9


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    store = await IMPLEMENTATIONS[request.param](tmp_path)
    yield store
    await store.close()


def _v(*xs: float) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


async def _ids(
    m: MemoryStore, cid: int, query: list[float], *, after_id: int = 0, before_id: int = TOP,
    limit: int = 9, model: str = M,
) -> list[int]:  # fmt: skip
    hits = await m.vector_search(cid, query, model=model, after_id=after_id,
                                 before_id=before_id, limit=limit)  # fmt: skip
    return [h[0] for h in hits]


async def _say(m: MemoryStore, key: ConversationKey, text: str) -> tuple[int, int]:
    conv = await m.conversation(key)
    mid = await m.add_message(conv.id, role="user", author=key.person, text=text, tokens=1,
                              status="pending")  # fmt: skip
    return mid, conv.id


async def test_search_ranks_by_cosine_within_the_id_range(memory: MemoryStore) -> None:
    vecs = [_v(1, 0, 0), _v(1, 1, 0), _v(0, 1, 0), _v(0, 0, 1), _v(1, 0.1, 0)]
    ids = []
    for i, vec in enumerate(vecs):
        mid, cid = await _say(memory, ALICE, f"m{i}")
        ids.append(mid)
        assert await memory.add_vectors([(mid, cid, M, vec)]) == 1
    hits = await memory.vector_search(cid, [2, 0, 0], model=M, after_id=0, before_id=TOP, limit=3)
    assert [h[0] for h in hits] == [ids[0], ids[4], ids[1]]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-6)
    assert hits[2][1] == pytest.approx(math.sqrt(0.5), abs=1e-6)
    # after_id and before_id are exclusive bounds (a reset mark, the recent window's start)
    ranged = await memory.vector_search(cid, [1, 0, 0], model=M, after_id=ids[0],
                                        before_id=ids[4], limit=10)  # fmt: skip
    assert [h[0] for h in ranged] == [ids[1], ids[3], ids[2]]  # a tie: newer first
    assert await memory.vector_search(cid, [1, 0, 0], model=M, after_id=ids[4], before_id=TOP,
                                      limit=10) == []  # fmt: skip


async def test_search_never_reads_another_conversation(memory: MemoryStore) -> None:
    mine, alice = await _say(memory, ALICE, "my antenna is a yagi")
    theirs, bob = await _say(memory, BOB, "bob also has a yagi antenna")
    channel, alice_ch = await _say(memory, ConversationKey("mesh", ALICE.person, "ch1"), "yagi")
    await memory.add_vectors([(theirs, bob, M, _v(1, 0)), (channel, alice_ch, M, _v(1, 0))])
    await memory.add_vectors([(mine, alice, M, _v(0, 1))])
    hits = await memory.vector_search(alice, [1, 0], model=M, after_id=0, before_id=TOP, limit=9)
    assert [h[0] for h in hits] == [mine]
    assert [h[0] for h in await memory.vector_search(
        bob, [1, 0], model=M, after_id=0, before_id=TOP, limit=9)] == [theirs]  # fmt: skip


async def test_vectors_are_per_model_and_replaced_by_a_new_one(memory: MemoryStore) -> None:
    a, cid = await _say(memory, ALICE, "a")
    b, _ = await _say(memory, ALICE, "b")
    await memory.add_vectors([(a, cid, "old", _v(1, 0)), (b, cid, "old", _v(0, 1))])
    assert await memory.vector_search(cid, [1, 0], model="new", after_id=0, before_id=TOP,
                                      limit=9) == []  # fmt: skip
    assert [m.id for m in await memory.messages_missing_vectors("new", limit=9)] == [a, b]
    assert await memory.messages_missing_vectors("old", limit=9) == []
    await memory.add_vectors([(a, cid, "new", _v(1, 0, 0))])
    assert [m.id for m in await memory.messages_missing_vectors("old", limit=9)] == [a]
    new_hits = await memory.vector_search(cid, [1, 0, 0], model="new", after_id=0, before_id=TOP,
                                          limit=9)  # fmt: skip
    assert [h[0] for h in new_hits] == [a]
    old_hits = await memory.vector_search(cid, [1, 1], model="old", after_id=0, before_id=TOP,
                                          limit=9)  # fmt: skip
    assert [h[0] for h in old_hits] == [b]


async def test_missing_vectors_oldest_first_scoped_paged_and_after_reset(
    memory: MemoryStore,
) -> None:
    a1, alice = await _say(memory, ALICE, "a1")
    b1, bob = await _say(memory, BOB, "b1")
    a2, _ = await _say(memory, ALICE, "a2")
    a3, _ = await _say(memory, ALICE, "a3")
    await memory.add_vectors([(a2, alice, M, _v(1, 0))])
    missing = await memory.messages_missing_vectors(M, limit=9)
    assert [m.id for m in missing] == [a1, b1, a3]
    assert missing[0].text == "a1" and missing[0].conversation_id == alice
    assert [m.id for m in await memory.messages_missing_vectors(M, limit=2)] == [a1, b1]
    assert [m.id for m in await memory.messages_missing_vectors(M, limit=9, after_id=b1)] == [a3]
    scoped = await memory.messages_missing_vectors(M, limit=9, conversation_id=alice)
    assert [m.id for m in scoped] == [a1, a3]
    await memory.reset(alice)  # hidden forever: never worth embedding
    assert [m.id for m in await memory.messages_missing_vectors(M, limit=9)] == [b1]
    assert await memory.messages_missing_vectors(M, limit=9, conversation_id=bob) != []


async def test_add_vectors_skips_messages_gone_or_elsewhere(memory: MemoryStore) -> None:
    mine, alice = await _say(memory, ALICE, "alice")
    theirs, bob = await _say(memory, BOB, "bob")
    stored = await memory.add_vectors(
        [(mine, alice, M, _v(1, 0)), (theirs, alice, M, _v(1, 0)), (10**8, alice, M, _v(1, 0))]
    )
    assert stored == 1
    assert await memory.vector_search(bob, [1, 0], model=M, after_id=0, before_id=TOP,
                                      limit=9) == []  # fmt: skip
    hits = await memory.vector_search(alice, [1, 0], model=M, after_id=0, before_id=TOP, limit=9)
    assert [h[0] for h in hits] == [mine]


async def test_forget_removes_the_persons_vectors_only(memory: MemoryStore) -> None:
    mine, alice = await _say(memory, ALICE, "alice")
    theirs, bob = await _say(memory, BOB, "bob")
    await memory.add_vectors([(mine, alice, M, _v(1, 0)), (theirs, bob, M, _v(1, 0))])
    assert (
        await memory.vector_search(alice, [1, 0], model=M, after_id=0, before_id=TOP, limit=9) != []
    )  # fmt: skip  (the matrix is now cached)
    await memory.forget_person("mesh", ALICE.person)
    assert await memory.vector_search(alice, [1, 0], model=M, after_id=0, before_id=TOP,
                                      limit=9) == []  # fmt: skip
    assert await memory.add_vectors([(mine, alice, M, _v(1, 0))]) == 0  # a late indexer write
    hits = await memory.vector_search(bob, [1, 0], model=M, after_id=0, before_id=TOP, limit=9)
    assert [h[0] for h in hits] == [theirs]


async def test_search_sees_vectors_added_after_it_ran(memory: MemoryStore) -> None:
    ids = [(await _say(memory, ALICE, f"m{i}"))[0] for i in range(4)]
    cid = (await memory.conversation(ALICE)).id
    await memory.add_vectors([(ids[1], cid, M, _v(1, 0))])
    assert await _ids(memory, cid, [1, 0]) == [ids[1]]  # the matrix is now cached
    await memory.add_vectors([(ids[3], cid, M, _v(1, 0.5))])  # newer: appended
    assert await _ids(memory, cid, [1, 0]) == [ids[1], ids[3]]
    await memory.add_vectors([(ids[0], cid, M, _v(1, 0.2))])  # older (a backfill)
    await memory.add_vectors([(ids[1], cid, M, _v(0, 1))])  # replaced
    hits = await memory.vector_search(cid, [1, 0], model=M, after_id=0, before_id=TOP, limit=9)
    assert [h[0] for h in hits] == [ids[0], ids[3], ids[1]]
    assert hits[2][1] == pytest.approx(0.0, abs=1e-6)


async def test_degenerate_queries_find_nothing(memory: MemoryStore) -> None:
    mid, cid = await _say(memory, ALICE, "x")
    await memory.add_vectors([(mid, cid, M, _v(1, 0))])
    assert await _ids(memory, cid, [0, 0]) == []
    assert await _ids(memory, cid, [1, 0, 0]) == []  # another dimension
    assert await _ids(memory, cid, [1, 0], limit=0) == []
    assert await _ids(memory, cid + 99, [1, 0]) == []
    assert await _ids(memory, cid, [1, 0]) == [mid]
