"""The PostgreSQL connections every store table family shares: open (connect, migrate), close,
transactions, small query helpers, and the cross-process locks of several gateways.

Invariants:
- Queries go through a small pool; multi-statement writes run in one transaction on one
  connection (``_atomic``). Writes marked ``durable=False`` (``bot.memory.core.db``) go
  through a second pool whose sessions commit without waiting for the WAL flush
  (``synchronous_commit = off``). Pool connections keep no session state, so they go back to
  the pool without asyncpg's reset query (one round trip per use saved; ``_keep_session``);
  asyncpg's statement cache keeps each query prepared per connection. Database errors leave
  this module as ``StorageError`` whose message says how to fix the problem, so callers
  handle one error type for both backends. A server that cannot be reached (a restart) is
  waited for up to ``RECONNECT_SECONDS`` before a connection is handed out
  (``_connection``); a statement is never re-sent, so a write can never happen twice.
- Cross-process locks are PostgreSQL advisory locks held on one dedicated connection per
  process (``_locks``): a conversation's turn (``turn_lock``, waited for) and one-off derived
  work (``claim``, never waited for). They are released when the work ends or, if the process
  dies, when its connection closes; a lock connection that breaks is reported, reopened, and
  every lock it held is treated as lost (the work it guarded re-checks what it is about to do).
- The password comes from the caller (the environment), never from the URL in a config file.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Self, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from bot.errors import StorageError
from bot.memory.core.db import POSTGRES, CoreBase, Dialect, changed, numbered
from bot.memory.postgres.schema import migrate
from bot.memory.vectors import VectorCache
from bot.urls import redact, user_of

log = logging.getLogger("bot.memory")

POOL_SIZE = 8
RECONNECT_SECONDS = 10.0  # how long a query waits for an unreachable (restarting) server
LOCK_POLL_SECONDS = (0.02, 0.5)  # first and longest wait between tries of a held turn lock
TURN_LOCK = 1  # advisory lock class (first key); claims use records.*_CLAIM
_T = TypeVar("_T")

Row = asyncpg.Record
Conn: TypeAlias = "PoolConnectionProxy[Row]"


async def _keep_session(con: asyncpg.Connection) -> None:
    """Pool connections carry no session state (no session SET, LISTEN or advisory lock: locks
    live on the lock connection), so asyncpg's reset query (``RESET ALL``, ``UNLISTEN *``...)
    after every use would be a wasted round trip, half of them on a turn. asyncpg still rolls
    back a transaction left open before calling this."""


class PgBase(CoreBase):
    """Open with ``await PostgresStore.open(url, password=...)``; close with ``close()``."""

    dialect: ClassVar[Dialect] = POSTGRES

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        lazy: asyncpg.Pool,
        locks: asyncpg.Connection,
        url: str,
        password: str | None,
        gateway: str,
    ):
        self._pool = pool
        self._lazy = lazy  # synchronous_commit = off: writes whose loss in a crash costs nothing
        self._locks = locks
        self._locks_mutex = asyncio.Lock()
        self._held: dict[tuple[int, int], int] = {}
        self.url = url
        self.gateway = gateway  # this process's name among the gateways (its outbox rows)
        self._password = password
        self._vectors = VectorCache()
        self.last_erase = ""  # the status of the last VACUUM after a forget (tests read it)
        self._vector_marks: dict[tuple[int, str], tuple[int, int, int]] = {}

    # --- lifecycle -------------------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        url: str,
        *,
        password: str | None = None,
        gateway: str | None = None,
        copying: bool = False,
    ) -> Self:
        """``gateway`` names this gateway for its outbox rows (stable across restarts);
        default: the host name. ``copying``: open an unfinished migrate-store copy."""
        pool: asyncpg.Pool | None = None
        lazy: asyncpg.Pool | None = None
        try:
            pool = await asyncpg.create_pool(
                dsn=url, password=password, min_size=1, max_size=POOL_SIZE, reset=_keep_session
            )
            assert pool is not None
            async with pool.acquire() as con:
                applied = await migrate(con, copying=copying)
            if applied:
                log.info("database %s migrated: %s", redact(url), ", ".join(applied))
            lazy = await asyncpg.create_pool(
                dsn=url, password=password, min_size=1, max_size=POOL_SIZE, reset=_keep_session,
                server_settings={"synchronous_commit": "off"},
            )  # fmt: skip
            locks = await asyncpg.connect(dsn=url, password=password)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, StorageError) as exc:
            for opened in (pool, lazy):
                if opened is not None:
                    await opened.close()
            if isinstance(exc, StorageError):
                raise
            raise StorageError(explain(url, exc)) from None
        return cls(
            pool=pool,
            lazy=lazy,
            locks=locks,
            url=url,
            password=password,
            gateway=gateway or socket.gethostname(),
        )

    async def close(self) -> None:
        self._vectors.clear()
        try:
            await self._locks.close()
        finally:
            try:
                await self._lazy.close()
            finally:
                await self._pool.close()

    # --- queries ---------------------------------------------------------------------------
    async def _run(self, work: Callable[[Conn], Awaitable[_T]], *, durable: bool = True) -> _T:
        try:
            async with self._connection(durable=durable) as con:
                return await work(con)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise StorageError(explain(self.url, exc)) from exc

    @asynccontextmanager
    async def _connection(self, *, durable: bool = True) -> AsyncIterator[Conn]:
        """A pool connection; while the server cannot be reached or is starting up (a
        restart), keeps trying for ``RECONNECT_SECONDS`` before giving up. Only getting the
        connection is retried, before any statement of the work was sent, so nothing can be
        written twice; a connection that breaks during the work fails it (its transaction is
        rolled back by the server) with a ``StorageError`` the caller reports."""
        deadline = time.monotonic() + RECONNECT_SECONDS
        wait = 0.1
        pool = self._pool if durable else self._lazy
        while True:
            try:
                con = await pool.acquire()
                break
            except (OSError, asyncpg.CannotConnectNowError, asyncpg.PostgresConnectionError):
                if time.monotonic() + wait > deadline:
                    raise
                log.warning("PostgreSQL at %s unreachable; retrying in %.1f s",
                            redact(self.url), wait)  # fmt: skip
                await asyncio.sleep(wait)
                wait = min(wait * 2, 2.0)
        try:
            yield con
        finally:
            await pool.release(con)

    def _claim_gateway(self) -> str:
        return self.gateway

    @asynccontextmanager
    async def _atomic(self, *, durable: bool = True) -> AsyncIterator[PgTx]:
        """One transaction on one pooled connection: committed on exit, rolled back on any
        exception; database errors leave as ``StorageError``."""
        try:
            async with self._connection(durable=durable) as con, con.transaction():
                yield PgTx(con)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise StorageError(explain(self.url, exc)) from exc

    async def _all(self, sql: str, params: Iterable[Any] = ()) -> list[Row]:
        args, q = tuple(params), numbered(sql)
        return await self._run(lambda con: con.fetch(q, *args))

    async def _one(self, sql: str, params: Iterable[Any] = ()) -> Row | None:
        args, q = tuple(params), numbered(sql)
        return await self._run(lambda con: con.fetchrow(q, *args))

    async def _val(self, sql: str, params: Iterable[Any] = ()) -> Any:
        args, q = tuple(params), numbered(sql)
        return await self._run(lambda con: con.fetchval(q, *args))

    async def _exec(self, sql: str, params: Iterable[Any] = (), *, durable: bool = True) -> int:
        args, q = tuple(params), numbered(sql)
        return changed(await self._run(lambda con: con.execute(q, *args), durable=durable))

    async def database_bytes(self) -> int:
        """The whole database's size on the server (``pg_database_size``), for the monitor."""
        return int(await self._val("SELECT pg_database_size(current_database())"))

    # --- cross-process locks ---------------------------------------------------------------
    @asynccontextmanager
    async def turn_lock(self, conversation_id: int) -> AsyncIterator[None]:
        """This conversation's turn, exclusive across every process on the database: waits
        (polling a try-lock with backoff, so one connection serves every conversation)."""
        key = (TURN_LOCK, conversation_id)
        wait = LOCK_POLL_SECONDS[0]
        while not await self._try_lock(key):
            await asyncio.sleep(wait * (0.5 + random.random()))  # jitter: no lockstep polling
            wait = min(wait * 2, LOCK_POLL_SECONDS[1])
        try:
            yield
        finally:
            await self._unlock(key)

    @asynccontextmanager
    async def claim(self, kind: int, conversation_id: int) -> AsyncIterator[bool]:
        """True when this process got the one-off job ``kind`` for the conversation; False
        when another process (or task) is doing it now. Never waits."""
        key = (kind, conversation_id)
        got = await self._try_lock(key)
        try:
            yield got
        finally:
            if got:
                await self._unlock(key)

    async def _try_lock(self, key: tuple[int, int]) -> bool:
        async with self._locks_mutex:
            if key in self._held:
                return False  # session locks are re-entrant; ours must not be
            got = bool(await self._on_lock_connection("pg_try_advisory_lock", key))
            if got:
                self._held[key] = 1
            return got

    async def _unlock(self, key: tuple[int, int]) -> None:
        async with self._locks_mutex:
            if self._held.pop(key, None) is not None:
                await self._on_lock_connection("pg_advisory_unlock", key)

    async def _on_lock_connection(self, function: str, key: tuple[int, int]) -> Any:
        sql = f"SELECT {function}($1::int, $2::int)"
        args = (key[0], key[1] % (1 << 31))
        try:
            return await self._locks.fetchval(sql, *args)
        except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError) as exc:
            log.warning("the lock connection broke (%s); reopening, held locks are lost", exc)
            self._held.clear()
            try:
                self._locks = await asyncpg.connect(dsn=self.url, password=self._password)
                return await self._locks.fetchval(sql, *args)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as again:
                raise StorageError(explain(self.url, again)) from again


class PgTx:
    """The core's ``Tx`` on one pooled connection inside its transaction (``_atomic``)."""

    __slots__ = ("_con",)

    def __init__(self, con: Conn) -> None:
        self._con = con

    @property
    def con(self) -> Conn:
        """The raw connection, for what only PostgreSQL does (``advance_sequences``)."""
        return self._con

    async def all(self, sql: str, params: Iterable[Any] = ()) -> list[Row]:
        return await self._con.fetch(numbered(sql), *params)

    async def one(self, sql: str, params: Iterable[Any] = ()) -> Row | None:
        return await self._con.fetchrow(numbered(sql), *params)

    async def val(self, sql: str, params: Iterable[Any] = ()) -> Any:
        return await self._con.fetchval(numbered(sql), *params)

    async def exec(self, sql: str, params: Iterable[Any] = ()) -> int:
        return changed(await self._con.execute(numbered(sql), *params))

    async def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self._con.executemany(numbered(sql), rows)


async def advance_sequences(con: Conn) -> None:
    """Move every identity sequence past the ids written explicitly (imports, migrate-store),
    so new rows never collide with copied ones."""
    tables = await con.fetch(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND column_name = 'id' AND is_identity = 'YES'"
    )
    for (table,) in tables:
        await con.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
            f"greatest((SELECT max(id) FROM {table}), 1), "
            f"(SELECT max(id) FROM {table}) IS NOT NULL)"
        )


def _grant(url: str, text: str) -> str:
    """The GRANT that fixes a refused privilege, as precisely as the error says it."""
    role = user_of(url) or "<the bot's role>"
    schema = re.search(r"permission denied for schema (\S+)", text)
    if schema or "permission denied to create" in text or "for database" not in text:
        name = schema.group(1) if schema else "public"
        return (
            f"Fix: as the database owner run: GRANT USAGE, CREATE ON SCHEMA {name} TO {role}; "
            "(the bot creates and migrates its tables itself; docs/postgresql.md)."
        )
    return (
        f"Fix: as the database owner run: GRANT CONNECT ON DATABASE <database> TO {role}; "
        f"and GRANT USAGE, CREATE ON SCHEMA public TO {role}; (docs/postgresql.md)."
    )


def explain(url: str, exc: BaseException) -> str:
    where = redact(url)
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return (
            f"PostgreSQL at {where} refused the login ({text}). Fix: check the user in "
            "storage.url and the password in the variable named by storage.password_env."
        )
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return f"PostgreSQL at {where}: the bot's role lacks a privilege ({text}). " + _grant(
            url, text
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return (
            f"PostgreSQL at {where}: {text}. Fix: create the database "
            "(docs/postgresql.md lists how)."
        )
    if isinstance(exc, OSError | asyncpg.PostgresConnectionError | asyncpg.InterfaceError):
        return (
            f"cannot reach PostgreSQL at {where} ({text}). Fix: check that the server runs "
            "and that host and port in storage.url are right."
        )
    return f"PostgreSQL error at {where}: {text}."
