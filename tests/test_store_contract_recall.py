"""Contract suite for the ``Recall`` Protocol (bot.memory.port_recall): the term index, the
outline and recall notes (vectors: test_store_contract_vectors.py). Every test runs on SQLite
and PostgreSQL (the ``memory`` fixture, tests/conftest.py)."""

from __future__ import annotations

from bot.memory.port import MemoryStore
from tests.test_store_contract import ALICE, BOB, _say


async def test_search_is_scoped_to_one_conversation(memory: MemoryStore) -> None:
    mine = await _say(memory, ALICE, "my antenna is a yagi")
    await _say(memory, BOB, "bob also has a yagi antenna")
    conv = await memory.conversation(ALICE)
    hits = await memory.search_terms(conv.id, ["yagi", "antenna"], after_id=0, before_id=10**9)
    assert hits == [[mine], [mine]]
    assert [m[0] for m in await memory.outline(conv.id, after_id=0, before_id=10**9)] == [mine]
