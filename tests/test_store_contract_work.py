"""Contract suite for the ``WorkQueue`` Protocol (bot.memory.port_work): pending questions,
their claims, held commands (turn locks and one-off claims: test_store_contract_gateways.py).
Every test runs on SQLite and PostgreSQL (the ``memory`` fixture, tests/conftest.py)."""

from __future__ import annotations

import asyncio
import time

from bot.memory.port import MemoryStore
from tests.test_store_contract import ALICE, BOB, _say


async def test_pending_messages_are_found_for_recovery(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    await memory.add_message(
        conv.id,
        role="assistant",
        author="bot",
        text="done",
        tokens=1,
        status="sent",
        answers=await _say(memory, ALICE, "answered"),
    )
    q = await _say(memory, ALICE, "unanswered")
    found = await memory.pending_messages(since=time.time() - 60, transports=["mesh"])
    assert [(key, m.id) for key, m in found] == [(ALICE, q)]
    assert await memory.pending_messages(since=time.time() - 60, transports=["discord"]) == []


async def test_every_pending_question_is_listed_and_stale_claims_are_found(
    memory: MemoryStore,
) -> None:
    """Several waiting questions of one person are each listed, oldest first (each gets its
    own answer; they were once folded into the latest); with ``stale_before`` only the ones
    whose claim is empty or older than it, stored before it."""
    first = await _say(memory, ALICE, "first")
    second = await _say(memory, ALICE, "second")
    third = await _say(memory, ALICE, "third")
    found = await memory.pending_messages(since=0, transports=["mesh"])
    assert [m.id for _, m in found] == [first, second, third]
    await asyncio.sleep(0.02)
    between = time.time()  # after the three were stored, before the claim
    await asyncio.sleep(0.02)
    assert await memory.claim_question(second, stale_before=time.time() - 300)
    assert (
        await memory.pending_messages(since=0, transports=["mesh"], stale_before=between - 60) == []
    )  # all stored just now: their gateway may still be at work
    stale = await memory.pending_messages(since=0, transports=["mesh"], stale_before=between)
    assert [m.id for _, m in stale] == [first, third]  # second's claim is newer: live
    later = await memory.pending_messages(
        since=0, transports=["mesh"], stale_before=time.time() + 1
    )
    assert [m.id for _, m in later] == [first, second, third]  # its claim went stale


async def test_commands_are_held_until_released(memory: MemoryStore) -> None:
    first = await memory.hold_command(ALICE, "!facts", platform_id="7", author="alice")
    second = await memory.hold_command(BOB, "!reset", platform_id=None, author=None)
    held = await memory.held_commands(transports=["mesh"])
    assert [(c.id, c.key, c.text, c.platform_id) for c in held] == [
        (first, ALICE, "!facts", "7"),
        (second, BOB, "!reset", None),
    ]
    assert await memory.held_commands(transports=["discord"]) == []
    await memory.release_command(first)
    assert [c.id for c in await memory.held_commands(transports=["mesh"])] == [second]


async def test_mark_answered_takes_only_pending_questions(memory: MemoryStore) -> None:
    conv = await memory.conversation(ALICE)
    first, second = await _say(memory, ALICE, "one"), await _say(memory, ALICE, "two")
    await memory.set_status(second, "failed")
    assert await memory.mark_answered(conv.id, [first, second]) == 1
    assert [m.status for m in await memory.all_messages(conv.id)] == ["answered", "failed"]
    assert await memory.pending_messages(since=0, transports=["mesh"]) == []
