"""A real, throwaway PostgreSQL server for the tests (and for benchmarks by hand).

``PgServer.start()`` runs Debian's binaries (``/usr/lib/postgresql/*/bin``, installed by
``.ci/run`` through ``scripts/ensure-postgres.sh``): ``initdb`` into a temp dir, ``postgres`` on
a unix socket in that dir, no TCP port. initdb refuses to run as root, so as root the cluster
belongs to the ``postgres`` system user the Debian package creates.

The cluster authenticates like a real deployment: the superuser connects over the socket with
``trust``; every other role needs its password (scram-sha-256), so the store's password-from-
the-environment path is exercised. ``new_database()`` creates an empty database and grants the
bot's role exactly what docs/postgresql.md documents, nothing more.

Run ``python -m tests.pg_server`` to get a server (with the default, durable settings) for
``bench/pipeline --store`` by hand.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.memory.postgres import PostgresStore

BOT_ROLE = "meshsage"
BOT_PASSWORD = "test-only-password"
PASSWORD_ENV = "MESHSAGE_TEST_PG_PASSWORD"
_counter = itertools.count(1)


class PgUnavailable(RuntimeError):
    """The server could not be started here; the message says why and how to fix it."""


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PgUnavailable(
        "no PostgreSQL server binaries (initdb) found. Fix: run scripts/ensure-postgres.sh "
        "as root (apt-get install postgresql), as .ci/run does."
    )


def _version_key(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


def _scratch() -> str | None:
    """Where a test cluster (``durable=False`` only) lives: /dev/shm when it is a tmpfs with
    room (4 GiB free: a test session leaves a few hundred databases of ~9 MB each, removed at
    its end), else the default temp dir. Tests need no disk (fsync is off): in memory,
    creating a database and removing the cluster cost no disk I/O, which on a busy machine
    took seconds (17 s for the cluster's removal at the end of one run). A durable server
    (benchmarks) always stays on disk: on tmpfs a flushed commit would cost nothing and flatter
    the PostgreSQL figures."""
    try:
        fs = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if fs.f_bavail * fs.f_frsize >= 4 << 30 else None


class PgServer:
    def __init__(self, root: Path, bindir: Path, owner: str | None) -> None:
        self.root = root
        self.bindir = bindir
        self._owner = owner  # system user running the server (None: ourselves)
        self.socket_dir = root / "sock"
        self.data = root / "data"
        self.port = 5432
        self._options = ""

    @classmethod
    def start(cls, *, durable: bool = False) -> PgServer:
        """``durable=False`` (tests): no fsync at all. ``durable=True`` (benchmarks): the
        server's defaults, every commit flushed to disk."""
        bindir = _bindir()
        owner = "postgres" if os.geteuid() == 0 else None
        if owner is not None and shutil.which("runuser") is None:
            raise PgUnavailable("running as root without runuser: cannot start PostgreSQL")
        root = Path(tempfile.mkdtemp(prefix="meshsage-pg-", dir=None if durable else _scratch()))
        server = cls(root, bindir, owner)
        server.socket_dir.mkdir()
        if owner is not None:
            shutil.chown(root, owner)
            shutil.chown(server.socket_dir, owner)
        pwfile = root / "pw"
        pwfile.write_text("unused\n")
        if owner is not None:
            shutil.chown(pwfile, owner)
        server._run(
            "initdb", "-D", str(server.data), "-U", "postgres", "-E", "UTF8",
            "--locale=C.UTF-8", "--auth-local=trust", "--auth-host=scram-sha-256",
            "--no-sync",
        )  # fmt: skip
        hba = server.data / "pg_hba.conf"
        hba.write_text("local all postgres trust\nlocal all all scram-sha-256\n", encoding="utf-8")
        if owner is not None:
            shutil.chown(hba, owner)
        fast = (
            "" if durable else (" -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        )
        server._options = (
            f"-k {server.socket_dir} -c listen_addresses='' -c max_connections=200{fast}"
        )
        server.resume()
        server.psql(
            f"CREATE ROLE {BOT_ROLE} LOGIN PASSWORD '{BOT_PASSWORD}' "
            "NOSUPERUSER NOCREATEDB NOCREATEROLE"
        )
        return server

    def _run(self, tool: str, *args: str, input: str | None = None) -> str:
        cmd = [str(self.bindir / tool), *args]
        if self._owner is not None:
            cmd = ["runuser", "-u", self._owner, "--", *cmd]
        done = subprocess.run(
            cmd, capture_output=True, text=True, check=False, cwd=self.root, input=input
        )
        if done.returncode != 0:
            raise PgUnavailable(f"{tool} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def psql(self, sql: str, *, database: str = "postgres") -> str:
        """Run ``sql`` (statements and psql meta-commands such as ``\\c``) as the superuser."""
        return self._run(
            "psql", "-h", str(self.socket_dir), "-p", str(self.port), "-U", "postgres",
            "-d", database, "-v", "ON_ERROR_STOP=1", "-qAt", input=sql,
        )  # fmt: skip

    def url(self, database: str, *, role: str = BOT_ROLE) -> str:
        return f"postgresql://{role}@/{database}?host={self.socket_dir}&port={self.port}"

    def new_database(self, *, template: str | None = None) -> str:
        """An empty database with the bot role granted what docs/postgresql.md documents;
        ``template``: a copy of that database instead (``CREATE DATABASE ... TEMPLATE``: the
        same tables, rows, owners and schema grants; the database-level grants are given
        again, as they belong to the new database)."""
        name = f"t{os.getpid()}_{next(_counter)}_{int(time.time() * 1000) % 100000}"
        self.psql(
            f"CREATE DATABASE {name}{f' TEMPLATE {template}' if template else ''};\n"
            f"GRANT CONNECT, TEMPORARY ON DATABASE {name} TO {BOT_ROLE};\n"
            f"\\c {name}\n"
            f"GRANT USAGE, CREATE ON SCHEMA public TO {BOT_ROLE};\n"
        )
        return name

    def drop_database(self, name: str) -> None:
        self.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def halt(self) -> None:
        """Stop the server as a restart does (fast shutdown), keeping its data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start the server (again) on the same data."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
            "start", "-o", self._options,
        )  # fmt: skip

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


_shared: PgServer | PgUnavailable | None = None
_migrated: str | None = None  # the shared server's database the bot's migrations ran on once


def shared() -> PgServer:
    """The session's server, started on first use; skips the calling test, saying why, when
    this machine cannot run one (``.ci/run`` makes sure CI can)."""
    import pytest

    global _shared
    if _shared is None:
        try:
            _shared = PgServer.start()
        except PgUnavailable as exc:
            _shared = exc
    if isinstance(_shared, PgUnavailable):
        pytest.skip(f"PostgreSQL tests need a local server: {_shared}")
    return _shared


def stop_shared() -> None:
    global _shared, _migrated
    if isinstance(_shared, PgServer):
        _shared.stop()
    _shared = None
    _migrated = None


async def open_store() -> PostgresStore:
    """A PostgresStore on a new database of the shared server holding no rows, as the bot's
    role. The database is a copy of one the store migrated once per server (the first call
    opens a store on an empty database, which runs every migration, and closes it): the same
    tables and migration records ``PostgresStore.open`` leaves on an empty database, without
    paying for every migration again in every test (about 0.7 s each on 2 cores). Tests of the
    migrations themselves open the store on the ``url`` fixture's empty database."""
    from bot.memory.postgres import PostgresStore

    global _migrated
    server = shared()
    if _migrated is None:
        first = server.new_database()
        store = await PostgresStore.open(server.url(first), password=BOT_PASSWORD)
        await store.close()
        _migrated = first
    name = server.new_database(template=_migrated)
    return await PostgresStore.open(server.url(name), password=BOT_PASSWORD)


if __name__ == "__main__":  # a server for benchmarks by hand; Ctrl-C or SIGTERM stops it
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    srv = PgServer.start(durable="--fast" not in sys.argv)
    db = srv.new_database()
    print(f"export {PASSWORD_ENV}={BOT_PASSWORD}")
    print(srv.url(db))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
