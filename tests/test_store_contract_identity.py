"""Contract suite for the ``Identities`` Protocol (bot.memory.port_identity): link codes
(linked DMs and incognito: test_store_contract_upkeep.py, test_store_stretches.py; key pins:
test_mesh_identity_store.py). Every test runs on SQLite and PostgreSQL (the ``memory``
fixture, tests/conftest.py)."""

from __future__ import annotations

from bot.memory.port import MemoryStore

NOW = 1_000_000.0


async def test_a_link_code_is_spent_once_and_only_from_another_transport(
    memory: MemoryStore,
) -> None:
    assert await memory.save_link_code("h1", "mesh", "!a", expires_at=NOW + 600, now=NOW)
    assert not await memory.save_link_code("h1", "mesh", "!b", expires_at=NOW + 600, now=NOW)
    assert await memory.take_link_code("h1", transport="mesh", now=NOW) is None  # same side
    assert await memory.take_link_code("h1", transport="discord", now=NOW) == ("mesh", "!a")
    assert await memory.take_link_code("h1", transport="discord", now=NOW) is None  # spent


async def test_a_new_code_replaces_the_persons_old_one_and_codes_expire(
    memory: MemoryStore,
) -> None:
    assert await memory.save_link_code("old", "mesh", "!a", expires_at=NOW + 600, now=NOW)
    assert await memory.save_link_code("new", "mesh", "!a", expires_at=NOW + 600, now=NOW)
    assert await memory.take_link_code("old", transport="discord", now=NOW) is None
    assert await memory.take_link_code("new", transport="discord", now=NOW + 600) is None
    assert await memory.save_link_code("old", "mesh", "!b", expires_at=NOW + 900, now=NOW + 700)


async def test_failed_redemptions_are_counted_per_person(memory: MemoryStore) -> None:
    for person, at in (("1", NOW), ("1", NOW + 1), ("2", NOW + 2)):
        await memory.note_link_failure("discord", person, now=at)
    assert await memory.link_failures(since=NOW) == (
        3, {("discord", "1"): 2, ("discord", "2"): 1}
    )  # fmt: skip
    assert await memory.link_failures(since=NOW + 1.5) == (1, {("discord", "2"): 1})
    await memory.note_link_failure("discord", "3", now=NOW + 90_000)  # a day on: old ones go
    assert await memory.link_failures(since=0.0) == (1, {("discord", "3"): 1})
