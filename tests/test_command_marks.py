"""A held command runs exactly once across a kill, on every store (migration 021).

- Its effect (``done=<held id>``) and the command's done mark commit in one transaction: a
  crash between the two statements leaves neither, a commit leaves both.
- A replay after a kill that came after the effect tells the person ("done just before I
  restarted") instead of applying it again; one killed before the effect runs it once.
- A released command stays, without its text, as a tombstone that Discord catch-up sees
  (``known_platform_ids``), until it is older than the longest catch-up window.

Before: ``!unremember 1`` replayed after its effect removed a second fact; ``!reset``
replayed moved the mark past questions asked after it; the held row was deleted at release,
so catch-up read a command back from history and ran it again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.domain import DM_SPACE, ConversationKey, Inbound
from bot.memory.core.db import CoreBase, Tx
from bot.memory.keep import COMMAND_TOMBSTONE_SECONDS, outbox_cutoff
from bot.memory.port import MemoryStore
from bot.memory.records import USER, OutboxEntry
from bot.recovery import DONE_AT_RESTART
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM

ALICE = ConversationKey("mesh", "!0000abcd")
ON_DISCORD = ConversationKey("discord", "42")


def _inbound(text: str) -> Inbound:
    return Inbound(transport="fake", sender="alice", space=DM_SPACE, text=text,
                   message_id="p7", sender_name="alice", authenticated=True)  # fmt: skip


class Killed(Exception):
    """The process died here (the transaction in flight is rolled back, as on a kill)."""


async def _done(memory: MemoryStore) -> dict[int, bool]:
    return {c.id: c.done for c in await memory.held_commands(transports=["mesh", "discord"])}


async def test_each_effect_marks_its_held_command_done_in_its_own_commit(
    memory: MemoryStore,
) -> None:
    conv = await memory.conversation(ALICE)
    await memory.add_message(conv.id, role=USER, author="a", text="hi", tokens=1,
                             status="answered")  # fmt: skip
    ids = [
        await memory.hold_command(
            ALICE, f"!c{i}", platform_id=None, author=None, authenticated=True
        )
        for i in range(8)
    ]
    fact = await memory.add_fact(conv.id, text="my boat is the Heron", tokens=4, done=ids[0])
    assert await _done(memory) == {ids[0]: True, **{i: False for i in ids[1:]}}
    await memory.revise_fact(conv.id, fact, text="my boat is the Egret", tokens=4,
                             pinned=True, source_ids=[], done=ids[1])  # fmt: skip
    await memory.reset(conv.id, done=ids[2])
    await memory.set_chat_setting("*", "persona", "pirate", done=ids[3])
    assert await memory.remove_fact(conv.id, fact, done=ids[4])
    await memory.link_dm(ON_DISCORD, ALICE, done=ids[5])
    assert await memory.unlink_dm(ALICE, done=ids[6]) is not None
    [said] = await memory.all_messages(conv.id)
    assert await memory.mark_important(conv.id, [said.id], done=ids[7]) == 1
    assert set((await _done(memory)).values()) == {True}
    # without done= nothing is marked
    other = await memory.hold_command(
        ALICE, "!facts", platform_id=None, author=None, authenticated=True
    )
    await memory.add_fact(conv.id, text="unmarked", tokens=1)
    assert (await _done(memory))[other] is False


async def test_a_kill_between_effect_and_mark_leaves_neither(
    memory: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = await memory.conversation(ALICE)
    first = await memory.add_fact(conv.id, text="one", tokens=1)
    held = await memory.hold_command(
        ALICE, "!unremember 1", platform_id=None, author=None, authenticated=True
    )

    async def die(self: CoreBase, tx: Tx, command_id: int | None) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(CoreBase, "_command_done", die)
        with pytest.raises(Killed):
            await memory.remove_fact(conv.id, first, done=held)
        with pytest.raises(Killed):
            await memory.add_fact(conv.id, text="two", tokens=1, done=held)
        with pytest.raises(Killed):
            await memory.reset(conv.id, done=held)
    assert [f.text for f in await memory.facts(conv.id)] == ["one"]  # rolled back together
    assert await _done(memory) == {held: False}
    assert await memory.reset_mark(conv.id) == 0


async def test_a_released_command_stays_known_to_catch_up_without_its_text(
    memory: MemoryStore,
) -> None:
    now = time.time()
    held = await memory.hold_command(
        ON_DISCORD, "!remember my pin is 1234", platform_id="1001", author="al", authenticated=True
    )
    await memory.hold_command(
        ON_DISCORD, "!facts", platform_id="1002", author="al", authenticated=True
    )
    ids = ["1001", "1002", "1003"]
    assert await memory.known_platform_ids("discord", ids, since=now - 60) == {"1001", "1002"}
    assert await memory.known_platform_ids("meshtastic", ids, since=now - 60) == set()
    await memory.release_command(held)
    assert [c.platform_id for c in await memory.held_commands(transports=["discord"])] == ["1002"]
    assert await memory.known_platform_ids("discord", ids, since=now - 60) == {"1001", "1002"}
    rows = await memory._all(  # type: ignore[attr-defined]
        "SELECT text, person, space, author FROM held_commands WHERE id = ?", (held,)
    )
    assert [tuple(r) for r in rows] == [("", "", "", None)]  # no words, no one named

    await memory.prune_outbox(outbox_cutoff(time.time()))
    assert "1001" in await memory.known_platform_ids("discord", ids, since=now - 60)
    later = time.time() + COMMAND_TOMBSTONE_SECONDS + 60
    await memory.prune_outbox(outbox_cutoff(later))
    assert await memory.known_platform_ids("discord", ids, since=now - 60) == {"1002"}


async def test_a_command_reply_queued_releases_its_command_in_the_same_write(
    memory: MemoryStore,
) -> None:
    held = await memory.hold_command(
        ALICE, "!facts", platform_id="5", author="a", authenticated=True
    )
    other = await memory.hold_command(
        ALICE, "!help", platform_id="6", author="a", authenticated=True
    )
    row = await memory.queue_claimed(OutboxEntry(ALICE, "command", "No facts yet."),
                                     release=held)  # fmt: skip
    assert row.entry.text == "No facts yet."
    assert [c.id for c in await memory.held_commands(transports=["mesh"])] == [other]
    assert "5" in await memory.known_platform_ids("mesh", ["5"], since=0.0)  # tombstone


# --- through the app: a kill after the effect, before the reply ------------------------------
@pytest.mark.parametrize(
    ("command", "facts_after"),
    [
        ("!remember my boat is the Heron", ["my door code is 4521", "my boat is the Heron"]),
        ("!unremember 1", ["my boat is the Heron"]),
    ],
)
async def test_a_command_killed_after_its_effect_is_told_not_run_again(
    tmp_path: Path, fake_llm: FakeLLM, command: str, facts_after: list[str]
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    await h.say("!remember my door code is 4521")
    if command.startswith("!unremember"):
        await h.say("!remember my boat is the Heron")
    key = h.transport_key("alice")
    held = await h.store.hold_command(
        key, command, platform_id="p7", author="alice", authenticated=True
    )
    name, _, arg = command[1:].partition(" ")
    inbound = _inbound(command)
    # the effect commits (with its mark); the process dies before the reply is queued
    await h.app.commands.run(inbound, name, arg, command_id=held)
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        conv = await h.store.conversation(key)
        assert [f.text for f in await h.store.facts(conv.id)] == facts_after
        assert h.transport.texts() == [DONE_AT_RESTART.format(command="!" + name)]
        assert await h.store.held_commands(transports=["fake"]) == []
    finally:
        await h.app.close()


async def test_a_reset_killed_after_its_effect_keeps_later_questions(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """A replayed ``!reset`` would move the mark past a question asked after it."""
    h = await start_harness(tmp_path, fake_llm)
    await h.say("hello")
    key = h.transport_key("alice")
    held = await h.store.hold_command(
        key, "!reset", platform_id="p8", author="alice", authenticated=True
    )
    await h.app.commands.run(_inbound("!reset"), "reset", "",
                                        command_id=held)  # fmt: skip
    conv = await h.store.conversation(key)
    mark = await h.store.reset_mark(conv.id)
    await h.store.add_message(conv.id, role=USER, author="alice", text="after the reset",
                              tokens=3, status="answered")  # fmt: skip
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        assert await h.store.reset_mark(conv.id) == mark
        assert h.transport.texts() == [DONE_AT_RESTART.format(command="!reset")]
    finally:
        await h.app.close()


async def test_a_command_killed_inside_its_effect_runs_once_at_restart(
    tmp_path: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    await h.say("!remember my door code is 4521")
    await h.say("!remember my boat is the Heron")
    key = h.transport_key("alice")
    held = await h.store.hold_command(
        key, "!unremember 1", platform_id="p9", author="alice", authenticated=True
    )

    async def die(self: CoreBase, tx: Tx, command_id: int | None) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(CoreBase, "_command_done", die)
        with pytest.raises(Killed):
            await h.app.commands.run(_inbound("!unremember 1"),
                                                "unremember", "1", command_id=held)  # fmt: skip
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        conv = await h.store.conversation(key)
        assert [f.text for f in await h.store.facts(conv.id)] == ["my boat is the Heron"]
        [reply] = h.transport.texts()
        assert reply.startswith("Removed fact 1")
    finally:
        await h.app.close()


async def test_recovery_skips_a_command_this_process_held_itself(
    tmp_path: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command heard live (e.g. read back by Discord catch-up) before recovery ran is queued
    once, by the live path; recovery does not queue it a second time."""
    from bot.turn_queue import Job, TurnQueue

    h = await start_harness(tmp_path, fake_llm)
    queued: list[Job] = []
    monkeypatch.setattr(TurnQueue, "put", lambda self, job: queued.append(job))
    try:
        await h.transport.say("!remember my boat is the Heron")
        assert [j.inbound.text for j in queued] == ["!remember my boat is the Heron"]
        assert len(await h.store.held_commands(transports=["fake"])) == 1
        await h.app.responder.recover_pending()
        assert len(queued) == 1  # not queued again by recovery
    finally:
        monkeypatch.undo()
        await h.app.close()


# --- the upgrade: a command held by the version before 021 ----------------------------------
_HELD_BEFORE = (
    "INSERT INTO held_commands (gateway, transport, person, space, text, platform_id, author, "
    "created_at) VALUES ({}, 'mesh', '!0000abcd', 'dm', '!facts', '77', 'al', 1000.0)"
)


async def _held_after_upgrade(store: MemoryStore) -> None:
    [held] = await store.held_commands(transports=["mesh"])
    assert (held.text, held.platform_id, held.done) == ("!facts", "77", False)
    assert await store.known_platform_ids("mesh", ["77"], since=0.0) == {"77"}
    await store.release_command(held.id)
    assert await store.held_commands(transports=["mesh"]) == []


async def test_a_command_held_before_021_is_still_replayed_after_the_upgrade_sqlite(
    tmp_path: Path,
) -> None:
    import aiosqlite

    from bot.memory.outbox_claims import SQLITE_GATEWAY
    from bot.memory.schema import MIGRATIONS, migrate
    from bot.memory.store import SqliteStore

    upto = [name for name, _ in MIGRATIONS].index("021_command_marks")
    db = await aiosqlite.connect(tmp_path / "m.db", isolation_level=None)
    await migrate(db, MIGRATIONS[:upto])
    await db.execute(_HELD_BEFORE.format("?"), (SQLITE_GATEWAY,))
    await db.close()
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        await _held_after_upgrade(store)
    finally:
        await store.close()


async def test_a_command_held_before_021_is_still_replayed_after_the_upgrade_postgres(
    url: str,
) -> None:
    asyncpg = pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")
    from bot.memory.postgres import PostgresStore
    from bot.memory.postgres.schema import MIGRATIONS, migrate
    from tests import pg_server

    upto = [name for name, _ in MIGRATIONS].index("021_command_marks")
    con = await asyncpg.connect(url, password=pg_server.BOT_PASSWORD)
    try:
        await migrate(con, MIGRATIONS[:upto])
        await con.execute(_HELD_BEFORE.format("$1"), "gw")
    finally:
        await con.close()
    store = await PostgresStore.open(url, password=pg_server.BOT_PASSWORD, gateway="gw")
    try:
        await _held_after_upgrade(store)
    finally:
        await store.close()
