"""Crash harness for commands: the real ``meshsage run`` process against the fake radio, killed
with SIGKILL while people's ``!unremember 1`` commands are being held, run and answered, on
both stores (the helpers and fixtures of tests/test_crash_harness.py).

``!unremember 1`` is the command whose second run does harm: it removes the next fact. So
after the kills and a last run that settles everything, what must hold is, per person:
facts removed == commands held (each command the bot heard and stored ran exactly once;
one lost to a kill before it was stored ran zero times and was never answered as done),
and one reply per held command (its own, or "done just before I restarted").
Before: the held command was released only after its reply went on air (seconds on the mesh),
so a kill in between ran it again at the restart and removed a second fact.
``CRASH_KILLS`` (default 6) sets the number of kills, as in the other harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from pathlib import Path

from bot.domain import DM_SPACE, ConversationKey
from bot.memory.port import MemoryStore
from tests import pg_server
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import FakeTcpRadio
from tests.test_crash_harness import (
    KILLS,
    _Backend,
    _Bot,
    _connected,
    _crash_config,
    _until,
    backend,
)

__all__ = ["backend"]  # the fixture, shared with tests/test_crash_harness.py

PEOPLE = [0xC0DE0101, 0xC0DE0102]
FACTS = [f"fact number {i}" for i in range(2 * KILLS + 2)]  # never all removed, even twice
HELD = "SELECT count(*) FROM held_commands WHERE id > {}"


async def _count(db: _Backend, sql: str) -> int:
    return await db.count(sql)


async def test_each_held_command_runs_once_across_kills(
    backend: _Backend, tmp_path: Path, fake_llm: FakeLLM
) -> None:
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    radio = FakeTcpRadio()
    config = _crash_config(tmp_path, radio, backend)
    bot = _Bot(config, backend.env(tmp_path, fake_llm), tmp_path)
    what = f"kill -9 during commands on {backend.name}, seed {seed}"
    total = len(FACTS) * len(PEOPLE)
    await _seed(backend)  # the facts each person will remove, one at a time
    try:
        first = await _count(backend, "SELECT coalesce(max(id), 0) FROM held_commands")
        replies_before = await _count(backend, "SELECT count(*) FROM outbox WHERE kind = 'command'")
        sent = 0
        for _kill in range(KILLS):
            before = radio.connections
            proc = await bot.start()
            assert await _connected(radio, before, proc), bot.tail()
            await asyncio.sleep(0.3)  # the library finishes its handshake
            for num in PEOPLE:
                radio.inject_text("!unremember 1", frm=num)
                sent += 1
            await asyncio.sleep(rng.uniform(0.0, 4.0))  # held, run, on air, or answered
            await bot.kill()
        await bot.up(radio)  # the last run: every held command is run or told
        with contextlib.suppress(AssertionError):  # the counts below say what is missing
            await _until(lambda: _none_held(backend, first), "every command answered", 90.0)
        await bot.terminate(30.0)
    finally:
        await bot.close()
        radio.stop()
    held = await _count(backend, HELD.format(first))
    left = await _count(backend, "SELECT count(*) FROM facts")
    replies = await _count(backend, "SELECT count(*) FROM outbox WHERE kind = 'command'")
    waiting = await _count(backend, HELD.format(first) + " AND released_at IS NULL")
    assert waiting == 0, f"{waiting} command(s) still held ({what})"
    assert total - left == held, f"{total - left} facts removed by {held} held commands ({what})"
    assert replies - replies_before == held, (
        f"{replies - replies_before} replies to {held} held commands ({what})"
    )
    assert held > 0, f"no command was held ({what})"
    print(
        f"crash harness ({what}): {KILLS} kills, {sent} !unremember sent, {held} held, "
        f"{total - left} facts removed, {replies - replies_before} replies"
    )


async def _seed(db: _Backend) -> None:
    """The facts, written before the bot first starts (the store then migrates itself)."""
    store: MemoryStore
    if db.url is None:
        from bot.memory.store import SqliteStore

        db.state.mkdir(parents=True, exist_ok=True)
        store = await SqliteStore.open(db.state / "meshsage.db")
    else:
        from bot.memory.postgres import PostgresStore

        store = await PostgresStore.open(db.url, password=pg_server.BOT_PASSWORD)
    try:
        for num in PEOPLE:
            conv = await store.conversation(ConversationKey("meshtastic", f"!{num:08x}", DM_SPACE))
            for fact in FACTS:
                await store.add_fact(conv.id, text=fact, tokens=4)
    finally:
        await store.close()


async def _none_held(db: _Backend, after: int) -> bool:
    rows = await db.rows(f"SELECT count(*) FROM held_commands WHERE id > {after} "
                         "AND released_at IS NULL")  # fmt: skip
    if not rows or rows[0][0]:
        return False
    return await db.count("SELECT count(*) FROM outbox WHERE state = 'pending'") == 0
