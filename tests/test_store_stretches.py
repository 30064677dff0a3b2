"""The store side of migration 010 on both backends: incognito stretch ids (a new one at every
``!incognito``, ``!reset`` or ``!forget``, for linked accounts too, and only in the space asked),
and the fact extraction mark (only forward; an import starts after its messages)."""

from __future__ import annotations

from pathlib import Path

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore
from tests.test_store_contract import ALICE, IMPLEMENTATIONS

CHAT = ConversationKey("discord", "1001")


async def test_every_start_and_end_gives_a_new_stretch_id(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    assert await memory.incognito_stretch(conv.id) is None
    await memory.set_incognito(conv.id, True)
    first = await memory.incognito_stretch(conv.id)
    await memory.set_incognito(conv.id, True)  # a new !incognito: a new stretch
    second = await memory.incognito_stretch(conv.id)
    assert first and second and first != second
    await memory.end_incognito(ALICE.transport, ALICE.person, space=ALICE.space)  # !reset
    third = await memory.incognito_stretch(conv.id)
    assert third and third != second and await memory.is_incognito(conv.id)
    await memory.set_incognito(conv.id, False)
    assert await memory.incognito_stretch(conv.id) is None
    await memory.end_incognito(ALICE.transport, ALICE.person, space=None)  # off stays off
    assert await memory.incognito_stretch(conv.id) is None


async def test_ending_reaches_linked_accounts_and_only_the_space_asked(
    memory: MemoryStore,
) -> None:
    home = await memory.conversation(ALICE)
    await memory.link_dm(ALICE, CHAT)
    await memory.set_incognito(home.id, True)
    held = await memory.incognito_stretch(home.id)
    channel = await memory.conversation(ConversationKey(ALICE.transport, ALICE.person, "ch"))
    await memory.set_incognito(channel.id, True)
    in_channel = await memory.incognito_stretch(channel.id)
    # Someone else, and another space of the same person, end nothing here.
    await memory.end_incognito(CHAT.transport, "someone else", space=None)
    await memory.end_incognito(ALICE.transport, ALICE.person, space="ch")
    assert await memory.incognito_stretch(home.id) == held
    assert await memory.incognito_stretch(channel.id) != in_channel
    # The linked chat account ends the home's stretch (its DM is the home's).
    await memory.end_incognito(CHAT.transport, CHAT.person, space=CHAT.space)
    assert await memory.incognito_stretch(home.id) not in (None, held)


async def test_the_facts_mark_only_moves_forward_and_an_import_starts_after_it(
    memory: MemoryStore, tmp_path: Path
) -> None:
    conv = await memory.conversation(ALICE)
    ids = [
        await memory.add_message(
            conv.id, role="user", author="alice", text=f"m{i}", tokens=1, status="answered"
        )
        for i in range(3)
    ]
    assert await memory.facts_through(conv.id) == 0
    await memory.set_facts_through(conv.id, ids[2])
    await memory.set_facts_through(conv.id, ids[0])  # a slower, earlier reader
    assert await memory.facts_through(conv.id) == ids[2]
    dump = await memory.dump_person(ALICE.transport, ALICE.person)
    other = await IMPLEMENTATIONS[sorted(IMPLEMENTATIONS)[0]](tmp_path / "other")
    try:
        await other.load_dump(ALICE.transport, ALICE.person, dump)
        assert await other.facts_through(conv.id) == ids[2]  # its facts came with it
    finally:
        await other.close()
