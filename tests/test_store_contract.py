"""Contract suite for the memory port, one file per Protocol of bot.memory.port, every test
run on each store implementation (the ``memory`` fixture, tests/conftest.py): SQLite on a file,
and PostgreSQL on a real server the suite starts itself (tests/pg_server.py), as the bot's
unprivileged role; the PostgreSQL runs are skipped, saying why, only when this machine cannot
start a server.

This file: ``ConversationLog`` (bot.memory.port_log), and the names the other files share.
The others: ``_derived`` (Derived, SessionLog), ``_recall`` and ``_vectors`` (Recall),
``_identity`` (Identities), ``_upkeep`` (Upkeep, Movable), ``_outbox`` (Outbox), ``_work``
(WorkQueue), ``_gateways`` (Claims, and what several gateways share), ``_edits``; Settings:
tests/test_chat_settings.py. tests/test_store_ports.py checks that every method of every
Protocol is called by a test that runs on both backends.
"""

from __future__ import annotations

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore
from tests.conftest import STORES

IMPLEMENTATIONS = STORES  # the other store suites import it from here
ALICE = ConversationKey("mesh", "!0000abcd")
BOB = ConversationKey("mesh", "!0000beef")


async def _say(m: MemoryStore, key: ConversationKey, text: str, role: str = "user") -> int:
    conv = await m.conversation(key)
    return await m.add_message(conv.id, role=role, author=key.person, text=text, tokens=2,
                               status="pending")  # fmt: skip


async def test_conversation_is_get_or_create(memory: MemoryStore) -> None:
    a = await memory.conversation(ALICE)
    assert (await memory.conversation(ALICE)).id == a.id
    assert await memory.find_conversation(BOB) is None
    dm, ch = (
        await memory.conversation(ALICE),
        await memory.conversation(ConversationKey(ALICE.transport, ALICE.person, "ch1")),
    )
    assert dm.id != ch.id
    assert [c.key.space for c in await memory.conversations_of("mesh", ALICE.person)] == [
        "dm", "ch1"
    ]  # fmt: skip


async def test_recent_messages_newest_first_and_after_reset(memory: MemoryStore) -> None:
    ids = [await _say(memory, ALICE, f"m{i}") for i in range(5)]
    conv = await memory.conversation(ALICE)
    assert [m.id for m in await memory.recent_messages(conv, limit=3)] == ids[:1:-1]
    assert [m.id for m in await memory.recent_messages(conv, limit=9, before_id=ids[2])] == [
        ids[1], ids[0]
    ]  # fmt: skip
    await memory.reset(conv.id)
    later = await _say(memory, ALICE, "after")
    conv = await memory.conversation(ALICE)
    assert [m.id for m in await memory.recent_messages(conv, limit=9)] == [later]


async def test_answers_marks_the_question_in_the_same_write(memory: MemoryStore) -> None:
    q = await _say(memory, ALICE, "question")
    conv = await memory.conversation(ALICE)
    await memory.add_message(conv.id, role="assistant", author="bot", text="answer", tokens=1,
                             status="sending", parent_id=q, answers=q)  # fmt: skip
    msgs = await memory.all_messages(conv.id)
    assert [(m.role, m.status) for m in msgs] == [("user", "answered"), ("assistant", "sending")]
    assert msgs[1].parent_id == q


async def test_reply_to_platform_id_resolves_the_parent(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    first = await memory.add_message(conv.id, role="assistant", author="bot", text="x",
                                     tokens=1, status="sent", platform_id="p-1")  # fmt: skip
    child = await memory.add_message(conv.id, role="user", author="a", text="y", tokens=1,
                                     status="pending", reply_to_platform_id="p-1")  # fmt: skip
    assert (await memory.messages_by_ids([child]))[0].parent_id == first


async def test_ancestors_walk_the_reply_chain_nearest_first(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    q = await _say(memory, ALICE, "question")
    a = await memory.add_message(conv.id, role="assistant", author="bot", text="answer", tokens=1,
                                 status="sent", parent_id=q, platform_id="p-9")  # fmt: skip
    r = await memory.add_message(conv.id, role="user", author="a", text="follow-up", tokens=1,
                                 status="pending", reply_to_platform_id="p-9")  # fmt: skip
    assert [m.id for m in await memory.ancestors(r, limit=5)] == [a, q]
    assert [m.id for m in await memory.ancestors(r, limit=1)] == [a]
    assert await memory.ancestors(q, limit=5) == []


async def test_context_for_a_second_question_includes_the_first_answer(
    memory: MemoryStore,
) -> None:
    q1 = await _say(memory, ALICE, "first question")
    q2 = await _say(memory, ALICE, "second question, sent before the first was answered")
    conv = await memory.conversation(ALICE)
    a1 = await memory.add_message(conv.id, role="assistant", author="bot", text="first answer",
                                  tokens=1, status="sent", parent_id=q1, answers=q1)  # fmt: skip
    seen = await memory.recent_messages(conv, limit=9, before_id=q2)
    assert [m.id for m in seen] == [a1, q1]


async def test_a_conversation_is_read_with_its_memory_incognito_flag(memory: MemoryStore) -> None:
    """``conversation`` carries the incognito flag of the memory it resolves to (a linked DM:
    the joined conversation's), so a message's intake needs no second read."""
    conv = await memory.conversation(ALICE)
    assert not conv.incognito
    await memory.set_incognito(conv.id, True)
    assert (await memory.conversation(ALICE)).incognito
    other = ConversationKey("discord", "42")
    await _say(memory, other, "from discord")
    assert await memory.link_dm(ALICE, other) == 1
    linked = await memory.conversation(other)
    assert linked.id == conv.id and linked.incognito
    await memory.set_incognito(conv.id, False)
    assert not (await memory.conversation(other)).incognito


async def test_messages_between_ids_come_with_their_recall_notes(memory: MemoryStore) -> None:
    ids = [await _say(memory, ALICE, f"m{i}") for i in range(4)]
    conv = await memory.conversation(ALICE)
    await memory.save_recall_note(ids[2], "you asked about m0", quoted=[ids[0]])
    between = await memory.messages_between(conv.id, after_id=ids[0], up_to_id=ids[2])
    assert [m.id for m in between] == ids[1:3]
    messages, notes = await memory.messages_with_notes(conv.id, after_id=ids[0], up_to_id=ids[2])
    assert messages == between and notes == {ids[2]: "you asked about m0"}
    assert await memory.messages_between(conv.id, after_id=ids[3], up_to_id=10**12) == []


async def test_bulk_rows_are_imported_and_counted_per_person(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    await memory.add_messages(conv.id, [("user", "a", "one", 1, 10.0),
                                        ("assistant", "bot", "two", 1, 11.0)])  # fmt: skip
    rows = [(m.role, m.text, m.status, m.created_at) for m in await memory.all_messages(conv.id)]
    assert rows == [("user", "one", "imported", 10.0), ("assistant", "two", "imported", 11.0)]
    await _say(memory, ConversationKey("mesh", ALICE.person, "ch1"), "on a channel")
    await _say(memory, BOB, "bob's")
    assert await memory.count_person_messages("mesh", ALICE.person) == 2  # user messages
    assert await memory.count_person_messages("mesh", ALICE.person, space="ch1") == 1
    assert await memory.count_person_messages("discord", ALICE.person) == 0


async def test_a_platform_id_finds_the_newest_message_that_has_it(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    for _ in range(2):
        newest = await memory.add_message(conv.id, role="assistant", author="bot", text="x",
                                          tokens=1, status="sent", platform_id="p-1")  # fmt: skip
    assert await memory.message_by_platform_id(conv.id, "p-1") == newest
    assert await memory.message_by_platform_id(conv.id, "p-2") is None
    bob = await memory.conversation(BOB)
    assert await memory.message_by_platform_id(bob.id, "p-1") is None
