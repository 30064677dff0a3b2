"""The SQLite connection every store table family shares: open (checks, pragmas, migrations),
close, transactions and small query helpers.

Invariants:
- Every write holds ``self._lock`` and multi-statement writes run in one explicit transaction,
  so coroutines sharing the connection never interleave inside each other's transactions.
- State files are private: ``open`` makes the directory 0700 and the database (and so its
  WAL/SHM, which copy its mode) 0600, whatever the umask.
- An upgrade (migrations pending on a database that has some applied) first writes
  ``<db>.before-<migration>.bak`` with SQLite's backup API.
- The WAL stays small next to the database: ``journal_size_limit`` cuts a restarted WAL back
  to ``WAL_KEEP_BYTES``, ``tidy`` truncates it once it outgrows half the database (at least
  256 KiB), and an autocheckpoint at ``WAL_SAFETY_PAGES`` bounds it on a bot never idle.
- ``open`` refuses a damaged file (header or pages, via ``quick_check``), a read-only file or
  an unwritable state directory with a ``StorageError`` that says how to fix it, and a full
  disk with ``DiskFull`` (exit code 28), not a generic I/O error.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, Self

import aiosqlite

from bot.errors import DiskFull, StorageError
from bot.files import private_dir, private_file, tighten_if_present
from bot.memory.core.db import SQLITE, CoreBase, Dialect, Tx
from bot.memory.core.versions import check_versions
from bot.memory.outbox_claims import SQLITE_GATEWAY
from bot.memory.schema import MIGRATIONS, applied_migrations, migrate
from bot.memory.vectors import VectorCache

log = logging.getLogger("bot.memory")

PAGE_SIZE = 1024  # for new databases (SQLite's default is 4096); see open()
WAL_KEEP_BYTES = 1024 * 1024  # a WAL file is cut back to this when it restarts
WAL_SAFETY_PAGES = 16_384  # autocheckpoint only past this (64 MiB of 4 KiB pages)


class SqliteBase(CoreBase):
    """Open with ``await SqliteStore.open(path)``; close with ``await store.close()``."""

    dialect: ClassVar[Dialect] = SQLITE

    def __init__(self, *, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path
        self._lock = asyncio.Lock()
        self._vectors = VectorCache()
        self._data_version: int | None = None
        self._claims: set[tuple[int, int]] = set()
        self._turns: dict[int, tuple[asyncio.Lock, int]] = {}  # lock, holders + waiters
        # tidy()'s checkpoint bookkeeping: rows changed at the last checkpoint and last tidy
        self._checkpointed_changes = 0
        self._tidy_changes = 0
        self._changed_at = time.monotonic()

    # --- lifecycle -------------------------------------------------------------------------
    @classmethod
    async def open(cls, path: Path, *, copying: bool = False) -> Self:
        """``copying``: open an unfinished migrate-store copy (``core.versions.COPY_MARK``)."""
        path = Path(path)
        try:
            private_dir(path.parent)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskFull(_disk_full(path)) from None
            raise StorageError(
                f"cannot create the state directory {path.parent} ({exc.strerror}). "
                "Fix: create it and make it writable by this user, or set MESHSAGE_STATE_DIR "
                "(or state_dir in the config) to a writable directory."
            ) from None
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise StorageError(
                f"the state directory {path.parent} is not writable. Fix: "
                f"chown/chmod it for this user, or set MESHSAGE_STATE_DIR to a writable directory."
            )
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise StorageError(
                f"the database {path} is read-only for this user. Fix: make the file and its "
                "directory writable for this user (chown/chmod); the bot stores every message."
            )
        db: aiosqlite.Connection | None = None
        try:
            # 0600 before SQLite opens it: the -wal and -shm files copy the database's mode.
            private_file(path)
            for suffix in ("-wal", "-shm"):
                tighten_if_present(path.with_name(path.name + suffix))
            db = await aiosqlite.connect(path, isolation_level=None)
            await db.execute("PRAGMA busy_timeout = 5000")
            # A new database gets small pages: each commit writes every page it touched to
            # the WAL (a turn touches ~35: table and index leaves, FTS segments), so 1 KiB pages
            # write a quarter of the bytes 4 KiB pages do. No effect on an existing file.
            await db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            mode = await (await db.execute("PRAGMA journal_mode = WAL")).fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                log.warning("journal_mode is %s, not WAL", mode)
            for pragma in (
                "PRAGMA foreign_keys = ON",
                "PRAGMA synchronous = NORMAL",
                "PRAGMA secure_delete = ON",
                "PRAGMA temp_store = MEMORY",
                # Checkpoints happen in tidy(), between turns, instead of inside a reply's
                # commit; tidy() truncates the WAL once it outgrows the database (small
                # disks: a WAL four times the database filled a 1 MiB state dir). A bot that
                # is never idle still checkpoints at WAL_SAFETY_PAGES, and a WAL that restarts
                # is cut back to WAL_KEEP_BYTES instead of keeping its largest size.
                f"PRAGMA wal_autocheckpoint = {WAL_SAFETY_PAGES}",
                f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}",
            ):
                await db.execute(pragma)
            done = await applied_migrations(db)
            check_versions(
                done, [name for name, _ in MIGRATIONS], f"the database {path}", copying=copying
            )
            todo = [name for name, _ in MIGRATIONS if name not in done]
            if done and todo:  # an upgrade: keep the old database until the new one works
                await _backup_before_upgrade(db, path, todo[0])
            applied = await migrate(db)
            if applied:
                log.info("database %s migrated: %s", path, ", ".join(applied))
            # quick_check reports damage as a row, not an exception: a file with a good header
            # but broken pages would otherwise open and fail on the first message.
            check = await (await db.execute("PRAGMA quick_check(1)")).fetchone()
            if check is None or check[0] != "ok":
                problem = " ".join(str(check[0]).split()) if check else "no result"
                raise sqlite3.DatabaseError(f"database disk image is malformed: {problem}")
            await db.execute("BEGIN IMMEDIATE")  # prove we can write before taking messages
            await db.execute("ROLLBACK")
        except StorageError:
            if db is not None:
                await db.close()
            raise
        except (sqlite3.DatabaseError, OSError) as exc:
            if db is not None:
                await db.close()
            if "disk is full" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC:
                raise DiskFull(_disk_full(path)) from None
            if isinstance(exc, OSError):
                raise
            raise StorageError(_explain_db_error(path, exc)) from None
        store = cls(db=db, path=path)
        finish = getattr(store, "finish_scrub", None)
        if finish is not None and await finish():
            log.info("finished erasing the text of a !forget a crash interrupted")
        return store

    async def close(self) -> None:
        async with self._lock:
            self._vectors.clear()
            with contextlib.suppress(sqlite3.Error):  # advisory; closing must still happen
                await self._db.execute("PRAGMA optimize")
            await self._db.close()

    # --- one process, one writer ----------------------------------------------------------
    @asynccontextmanager
    async def turn_lock(self, conversation_id: int) -> AsyncIterator[None]:
        """A conversation's turn, one holder at a time. One process owns a SQLite file, so an
        in-process lock is the whole job (kept only while someone holds or waits for it)."""
        lock, users = self._turns.get(conversation_id, (asyncio.Lock(), 0))
        self._turns[conversation_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[conversation_id]
            if users == 1:
                del self._turns[conversation_id]
            else:
                self._turns[conversation_id] = (lock, users - 1)

    @asynccontextmanager
    async def claim(self, kind: int, conversation_id: int) -> AsyncIterator[bool]:
        """True unless a task of this process holds the same one-off job right now."""
        key = (kind, conversation_id)
        if key in self._claims:
            yield False
            return
        self._claims.add(key)
        try:
            yield True
        finally:
            self._claims.discard(key)

    async def ping(self) -> None:
        """One trivial query through the lock and the connection's thread (the watchdog's
        proof that the store is not wedged)."""
        await self._one("SELECT 1")

    async def _all(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        async with self._lock:
            return list(await self._db.execute_fetchall(sql, tuple(params)))

    async def _one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self._all(sql, params)
        return rows[0] if rows else None

    async def _val(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self._all(sql, params)
        return rows[0][0] if rows else None

    async def _exec(self, sql: str, params: Iterable[Any] = (), *, durable: bool = True) -> int:
        # Autocommit: one statement is its own transaction, so no BEGIN/COMMIT round trips.
        async with self._lock:
            cur = await self._db.execute(sql, tuple(params))
            return cur.rowcount

    @asynccontextmanager
    async def _atomic(self, *, durable: bool = True) -> AsyncIterator[SqliteTx]:
        """One transaction: the store lock held, ``BEGIN IMMEDIATE`` (so no other writer, not
        even another process, gets in between), COMMIT on exit, ROLLBACK on any exception.
        ``durable`` changes nothing here (WAL, ``synchronous = NORMAL``: no commit waits for
        the disk)."""
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield SqliteTx(self._db)
                await self._db.execute("COMMIT")
            except BaseException:
                # Also when COMMIT itself fails ("SQL statements in progress", disk full): a
                # transaction left open would make every later BEGIN fail until a restart.
                if self._db.in_transaction:
                    await self._db.execute("ROLLBACK")
                raise

    async def _together(
        self, steps: Sequence[tuple[str, Sequence[Any]]], *, durable: bool = True
    ) -> int:
        """The steps in one transaction, in ONE hop to the connection's thread (BEGIN
        IMMEDIATE, the statements, COMMIT; ROLLBACK on any error), not one hop each.
        ``durable`` changes nothing here (see ``bot.memory.core.db``)."""

        def work() -> int:
            db = self._db._conn  # runs on aiosqlite's thread, the connection's own
            db.execute("BEGIN IMMEDIATE")
            try:
                n = 0
                for sql, params in steps:
                    n = db.execute(sql, tuple(params)).rowcount
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # COMMIT failed too: never leave it open (_atomic)
                    db.execute("ROLLBACK")
                raise
            return n

        async with self._lock:
            return int(await self._db._execute(work))  # type: ignore[no-untyped-call]

    def _search_column(
        self, conversation_id: int, author: str, text: str, created_at: float
    ) -> tuple[str, str, tuple[Any, ...]]:
        return "", "", ()  # the FTS triggers index messages as they arrive

    def _claim_gateway(self) -> str:
        return SQLITE_GATEWAY  # one process owns a SQLite file: one gateway

    async def _after_import(self, tx: Tx) -> None:
        """Nothing: SQLite's next rowid is always past the largest id."""


class SqliteTx:
    """The core's ``Tx`` on the store's connection, inside ``_atomic`` (lock held, BEGIN
    IMMEDIATE done): each call is one hop to the connection's thread."""

    __slots__ = ("_db",)

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    @property
    def db(self) -> aiosqlite.Connection:
        """The raw connection, for what only SQLite does (``executemany``'s row count)."""
        return self._db

    async def all(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        return list(await self._db.execute_fetchall(sql, tuple(params)))

    async def one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self.all(sql, params)
        return rows[0] if rows else None

    async def val(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self.all(sql, params)
        return rows[0][0] if rows else None

    async def exec(self, sql: str, params: Iterable[Any] = ()) -> int:
        cur = await self._db.execute(sql, tuple(params))
        return cur.rowcount

    async def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self._db.executemany(sql, rows)


async def _backup_before_upgrade(db: aiosqlite.Connection, path: Path, first: str) -> None:
    target = path.with_name(f"{path.name}.before-{first}.bak")
    private_file(target)
    copy = sqlite3.connect(target, check_same_thread=False)
    try:
        await db.backup(copy)
    finally:
        copy.close()
    log.info("database %s: backup before migration %s written to %s", path, first, target)


def _disk_full(path: Path) -> str:
    return (
        f"the disk holding {path.parent} is full (no space left to open the database {path}). "
        "Fix: free some space there (check with `df -h`; old logs and journal files are the "
        "usual suspects), or set MESHSAGE_STATE_DIR to a directory on a disk with room, then "
        "start again. Nothing was lost: the database is unchanged."
    )


def _explain_db_error(path: Path, exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return (
            f"the database {path} is damaged ({text}). Fix: stop the bot, move the file aside "
            "(keep it for recovery: `sqlite3 FILE .recover`), and start again to create a new one."
        )
    if "readonly" in text or "read-only" in text:
        return (
            f"the database {path} cannot be written ({text}). Fix: make the file and its "
            "directory writable for this user."
        )
    if "unable to open" in text:
        return (
            f"cannot open the database {path} ({text}). Fix: check that the state directory "
            "exists and is writable, or set MESHSAGE_STATE_DIR."
        )
    return f"database error on {path}: {text}. Fix: check the file and its directory."
