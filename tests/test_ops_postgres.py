"""Operations speak PostgreSQL: backup and restore with pg_dump/pg_restore (and the exact
commands when they are missing), doctor's server checks, the status and run log naming the
store without its password, the monitor's real database size. A real server throughout
(tests/pg_server.py)."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from bot.cli import main
from bot.config import StorageConfig
from bot.domain import ConversationKey
from bot.ops.doctor import Level
from bot.ops.metrics import LastError, Latencies
from bot.ops.monitor import Monitor
from bot.ops.sdnotify import Notifier
from bot.ops.status import render
from tests import pg_server
from tests.fakes.fake_llm import FakeLLM

pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")

from bot.memory.postgres import PostgresStore
from bot.ops.doctor_pg import check_postgres

ALICE = ConversationKey("mesh", "!0000abcd")
VAR = pg_server.PASSWORD_ENV


def _config(tmp_path: Path, url: str, extra: str = "") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"storage: {{url: '{url}', password_env: {VAR}}}\n" + extra,
        encoding="utf-8",
    )
    return path


async def _say(url: str, text: str) -> None:
    store = await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)
    try:
        conv = await store.conversation(ALICE)
        await store.add_message(
            conv.id, role="user", author="alice", text=text, tokens=2, status="answered"
        )
    finally:
        await store.close()


async def _texts(url: str) -> list[str]:
    store = await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)
    try:
        conv = await store.conversation(ALICE)
        return [m.text for m in await store.all_messages(conv.id)]
    finally:
        await store.close()


async def test_backup_and_restore_a_postgresql_store(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(VAR, pg_server.BOT_PASSWORD)
    await _say(url, "kept in the backup")
    config = str(_config(tmp_path, url))
    rc = await asyncio.to_thread(main, ["backup", "--config", config, f"{tmp_path}/b/"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    dumps = list((tmp_path / "b").glob("meshsage-*.dump"))
    assert len(dumps) == 1 and stat.S_IMODE(dumps[0].stat().st_mode) == 0o600
    assert "pg_dump custom format" in out.out and pg_server.BOT_PASSWORD not in out.out
    await _say(url, "written after the backup")
    rc = await asyncio.to_thread(main, ["restore", "--config", config, str(dumps[0])])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "stop every other gateway" in out.out
    assert await _texts(url) == ["kept in the backup"]
    # A file that is not a dump is refused before anything is touched.
    junk = tmp_path / "junk.dump"
    junk.write_bytes(b"not a dump")
    assert await asyncio.to_thread(main, ["restore", "--config", config, str(junk)]) == 3
    assert "not a pg_dump custom-format file" in capsys.readouterr().err
    assert await _texts(url) == ["kept in the backup"]


async def test_without_pg_dump_the_message_says_exactly_what_to_run(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(VAR, pg_server.BOT_PASSWORD)
    config = str(_config(tmp_path, url))
    with monkeypatch.context() as m:  # as on a Pi without the client tools
        m.setenv("PATH", str(tmp_path / "no-tools"))
        assert main(["backup", "--config", config, f"{tmp_path}/b/"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "pg_dump is not installed" in err and "apt install postgresql-client" in err
    assert "pg_dump --format=custom" in err and url.split("?")[0] in err
    assert pg_server.BOT_PASSWORD not in err
    assert not list(tmp_path.glob("b/*"))  # nothing half done


async def test_doctor_checks_the_server(url: str) -> None:
    storage = StorageConfig(url=url, password_env=VAR)
    env = {VAR: pg_server.BOT_PASSWORD}
    fresh = {c.name: c for c in await check_postgres(storage, env=env)}
    assert fresh["postgresql"].level is Level.OK
    assert "PostgreSQL 1" in fresh["postgresql"].detail and "logged in as meshsage" in (
        fresh["postgresql"].detail
    )
    assert "first start creates the tables" in fresh["postgresql schema"].detail
    assert fresh["postgresql disk"].level in (Level.OK, Level.SKIP, Level.WARN)
    await _say(url, "hello")  # opening the store migrates it
    done = {c.name: c for c in await check_postgres(storage, env=env)}
    assert done["postgresql schema"].level is Level.OK and "up to date" in (
        done["postgresql schema"].detail
    )
    wrong = await check_postgres(storage, env={VAR: "wrong"})
    assert wrong[0].level is Level.FAIL and "refused the login" in wrong[0].detail
    assert [c.level for c in wrong[1:]] == [Level.SKIP]  # one cause, one failure
    assert "wrong" not in wrong[0].line()
    unset = await check_postgres(storage, env={})
    assert unset[0].level is Level.FAIL and f"{VAR} is not set" in unset[0].detail


async def test_doctor_names_the_grant_when_the_role_cannot_create_tables() -> None:
    server = pg_server.shared()
    name = f"nocreate{os.getpid()}_{int(time.time() * 1000) % 100000}"
    server.psql(f"CREATE DATABASE {name};\nGRANT CONNECT ON DATABASE {name} TO meshsage;\n")
    try:
        storage = StorageConfig(url=server.url(name), password_env=VAR)
        checks = {
            c.name: c for c in await check_postgres(storage, env={VAR: pg_server.BOT_PASSWORD})
        }
        schema = checks["postgresql schema"]
        assert schema.level is Level.FAIL and "may not create tables" in schema.detail
        assert "GRANT USAGE, CREATE ON SCHEMA public TO meshsage" in schema.fix
    finally:
        server.drop_database(name)


async def test_doctor_unreachable_server(tmp_path: Path) -> None:
    storage = StorageConfig(url=f"postgresql://meshsage@/x?host={tmp_path}&port=1")
    checks = await check_postgres(storage, env={})
    assert checks[0].level is Level.FAIL and "cannot reach" in checks[0].detail
    assert checks[1].level is Level.SKIP


async def test_monitor_and_status_report_the_postgresql_store(tmp_path: Path, url: str) -> None:
    await _say(url, "hello")
    store = await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)
    try:
        monitor = Monitor(notifier=Notifier(env={}), store=store, transports=lambda: [],
                          status_path=tmp_path / "state" / "status.json", latencies=Latencies(),
                          last_error=LastError())  # fmt: skip
        snapshot = await monitor.tick()  # no state directory yet: the monitor makes it
    finally:
        await store.close()
    assert (tmp_path / "state" / "status.json").is_file()
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    assert snapshot.database_bytes > 1_000_000  # pg_database_size: a real size, not 0
    assert snapshot.store == f"PostgreSQL {url}"
    lines, _ = render(snapshot)
    shown = next(line for line in lines if "database:" in line)
    assert "PostgreSQL postgresql://meshsage@/" in shown and " MB" in shown


async def test_run_log_names_the_store_without_the_password(
    tmp_path: Path, url: str, fake_llm: FakeLLM
) -> None:
    config = _config(tmp_path, url, f"llm: {{base_url: '{fake_llm.base_url}', model: fake}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env[VAR] = pg_server.BOT_PASSWORD
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "chat", "-v", "--config", str(config),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(b"hello\n"), 60)
    text = err.decode()
    assert proc.returncode == 0, text
    assert f"store: PostgreSQL {url}" in text
    assert pg_server.BOT_PASSWORD not in text and "meshsage.db" not in text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://bot@db/m", "postgresql://bot@db/m"),
        ("postgresql://bot:pw@db:5433/m", "postgresql://bot:***@db:5433/m"),
        (
            "postgresql://bot@/m?host=/run/pg&port=5433",
            "postgresql://bot@/m?host=/run/pg&port=5433",
        ),
        (
            "postgresql://bot@db/m?password=pw&sslmode=require",
            "postgresql://bot@db/m?sslmode=require",
        ),
        ("postgresql://bot@db/m?password=pw", "postgresql://bot@db/m"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    from bot.urls import redact

    assert redact(url) == shown
