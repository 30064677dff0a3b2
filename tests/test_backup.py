"""Backups while the bot writes, restores that refuse a running bot, upgrade backups, and
private state files whatever the umask."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import aiosqlite
import pytest

from bot.cli import main
from bot.errors import StorageError
from bot.memory.schema import MIGRATIONS, migrate
from bot.memory.store import SqliteStore
from bot.ops.backup import RunLock, backup, restore
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _rows(path: Path) -> set[tuple[int, str, str]]:
    db = sqlite3.connect(path)
    try:
        assert [r[0] for r in db.execute("PRAGMA integrity_check")] == ["ok"]
        return {(r[0], r[1], r[2]) for r in db.execute("SELECT id, role, text FROM messages")}
    finally:
        db.close()


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


async def test_backup_while_turns_are_written_restores_every_committed_message(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = lambda req: "answer to " + req["messages"][-1]["content"][-12:]
    h = await start_harness(tmp_path, fake_llm)
    stop = asyncio.Event()

    async def writer() -> int:
        n = 0
        while not stop.is_set():
            n += 1
            await h.say(f"turn number {n}")
        return n

    task = asyncio.create_task(writer())
    try:
        while await h.store.stats() == {} or (await h.store.stats())["messages"] < 20:
            await asyncio.sleep(0.01)
        committed = {(r[0], r[1], r[2]) for r in await h.store._all(
            "SELECT id, role, text FROM messages")}  # fmt: skip
        target = tmp_path / "backups" / "snap.db"
        target.parent.mkdir()
        report = await asyncio.to_thread(backup, h.app.config.database_path, target)
        after_backup = await h.store.stats()
        stop.set()
        turns = await task
    finally:
        stop.set()
        await h.app.close()
    backed_up = _rows(target)
    assert committed <= backed_up  # everything committed before the backup began
    assert report.messages == len(backed_up)
    assert len(backed_up) <= after_backup["messages"]
    assert turns > 10 and _mode(target) == 0o600
    # Restore into the bot's database (bot stopped), then the store opens it.
    db = h.app.config.database_path
    report2, saved = restore(target, db)
    assert saved is not None and saved.exists() and _rows(saved) >= backed_up
    assert not db.with_name(db.name + "-wal").exists()
    assert _rows(db) == backed_up and report2.messages == len(backed_up)
    store = await SqliteStore.open(db)
    try:
        assert (await store.stats())["messages"] == len(backed_up)
    finally:
        await store.close()


async def test_restore_refuses_while_the_bot_runs(tmp_path: Path) -> None:
    db = tmp_path / "state" / "meshsage.db"
    store = await SqliteStore.open(db)
    await store.close()
    snap = tmp_path / "snap.db"
    backup(db, snap)
    with RunLock(db.parent), pytest.raises(StorageError, match="another meshsage process"):
        restore(snap, db)
    # After the bot stopped, the same restore works.
    restore(snap, db)


def test_restore_checks_the_backup_first(tmp_path: Path) -> None:
    db = tmp_path / "state" / "meshsage.db"
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StorageError, match="not a usable backup"):
        restore(junk, db)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(StorageError, match="not a meshsage database"):
        restore(other, db)
    assert not db.exists()  # nothing was touched


async def test_backup_and_restore_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MESHSAGE_STATE_DIR", str(tmp_path / "state"))
    assert main(["backup", str(tmp_path / "b.db")]) == 3
    assert "no database at" in capsys.readouterr().err
    store = await SqliteStore.open(tmp_path / "state" / "meshsage.db")
    await store.close()
    assert main(["backup", str(tmp_path), "-v"]) == 0
    out = capsys.readouterr().out
    assert "integrity ok" in out
    made = next(tmp_path.glob("meshsage-*.db"))
    assert main(["restore", str(made)]) == 0
    assert "previous database was saved" in capsys.readouterr().out


async def test_an_upgrade_backs_the_database_up_before_migrating(tmp_path: Path) -> None:
    path = tmp_path / "state" / "meshsage.db"
    path.parent.mkdir()
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await migrate(db, MIGRATIONS[:1])
        await db.execute(
            "INSERT INTO conversations (transport, person, space, created_at) "
            "VALUES ('console', 'alice', 'dm', 0)"
        )
    store = await SqliteStore.open(path)
    await store.close()
    saved = path.with_name(f"meshsage.db.before-{MIGRATIONS[1][0]}.bak")
    assert saved.exists() and _mode(saved) == 0o600
    copy = sqlite3.connect(saved)
    try:
        assert [r[0] for r in copy.execute("SELECT name FROM schema_migrations")] == [
            MIGRATIONS[0][0]
        ]
        assert copy.execute("SELECT count(*) FROM conversations").fetchone()[0] == 1
    finally:
        copy.close()


async def test_state_files_are_private_whatever_the_umask(
    tmp_path: Path, fake_llm: FakeLLM, loose_umask: None
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.say("hello")
        status = h.app.monitor
        assert status is not None
        await status.tick()
    finally:
        await h.app.close()
    state = tmp_path / "state"
    assert _mode(state) == 0o700
    for name in ("meshsage.db", "meshsage.db-wal", "meshsage.db-shm"):
        if (state / name).exists():
            assert _mode(state / name) == 0o600, name
    assert _mode(state / "meshsage.db") == 0o600


async def test_tightens_an_existing_loose_database(tmp_path: Path, loose_umask: None) -> None:
    state = tmp_path / "state"
    store = await SqliteStore.open(state / "meshsage.db")
    await store.close()
    os.chmod(state, 0o755)
    os.chmod(state / "meshsage.db", 0o644)
    store = await SqliteStore.open(state / "meshsage.db")
    await store.close()
    assert _mode(state) == 0o700 and _mode(state / "meshsage.db") == 0o600


async def test_console_exports_are_private(tmp_path: Path, loose_umask: None) -> None:
    import io

    from bot.domain import DM_SPACE, Attachment, Inbound, Reply, ReplyKind
    from bot.transports.console import ConsoleTransport

    async def idle() -> None:
        return None

    out = io.StringIO()
    console = ConsoleTransport(
        user="me", context_tokens=1000, max_tokens=100, wait_idle=idle,
        export_dir=tmp_path / "state" / "exports", stdin=io.BytesIO(b""), stdout=out,
    )  # fmt: skip
    inbound = Inbound(transport="console", sender="me", sender_name="me", space=DM_SPACE,
                      text="!export", message_id="1")  # fmt: skip
    reply = Reply(inbound=inbound, text="here", kind=ReplyKind.COMMAND,
                  attachments=(Attachment("me.json", b"{}"),))  # fmt: skip
    await console.send(reply)
    exported = tmp_path / "state" / "exports" / "me.json"
    assert _mode(exported) == 0o600 and _mode(exported.parent) == 0o700


async def test_console_forget_deletes_the_line_history(tmp_path: Path) -> None:
    import io

    from bot.transports.console import ConsoleTransport

    async def idle() -> None:
        return None

    history = tmp_path / "state" / "console_history"
    history.parent.mkdir()
    history.write_text("my secret is zanzibar\n")
    console = ConsoleTransport(
        user="me", context_tokens=1000, max_tokens=100, wait_idle=idle,
        export_dir=tmp_path / "state" / "exports", stdin=io.BytesIO(b""), stdout=io.StringIO(),
        history_file=history,
    )  # fmt: skip
    assert console.forget("someone else") == 0 and history.exists()
    assert console.forget("me") == 1
    assert not history.exists()


async def test_the_daily_timer_before_the_first_start_succeeds_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh install: the state dir exists (install.sh made it) but the bot has not started,
    so there is no database. The timer's run (--missing-ok) succeeds and says so; a run by
    hand fails with a fix that says to start the bot, not to pass --config."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("MESHSAGE_STATE_DIR", str(state))
    unit = (Path(__file__).parents[1] / "systemd" / "meshsage-backup.service").read_text()
    assert "backup --missing-ok" in unit
    assert main(["backup", "--missing-ok", "--keep", "7", f"{state}/backups/"]) == 0
    out = capsys.readouterr().out
    assert "nothing to back up" in out and "first start" in out
    assert not (state / "backups").exists()
    assert main(["backup", f"{state}/backups/"]) == 3
    err = capsys.readouterr().err
    assert "Fix: start the bot" in err and "first start" in err
