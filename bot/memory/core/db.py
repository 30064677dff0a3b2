"""The database as the store core sees it: four query calls, one transaction, one dialect.

Each backend base (``bot.memory.sqlite.base``, ``bot.memory.postgres.base``) implements
``CoreBase``; the table families in ``bot.memory.core`` are written once against it.

Invariants:
- SQL is written once with ``?`` placeholders. PostgreSQL rewrites it to ``$1, $2, ...`` once per
  distinct string (``numbered``, memoised), so the cost per query is a dict lookup; SQLite runs
  it as written, with no extra await per query.
- ``_exec`` returns the number of rows the statement changed, on both backends.
- ``_atomic()`` yields a ``Tx``: the same calls on one connection inside one transaction
  (SQLite: ``BEGIN IMMEDIATE`` under the store lock, so it is already serialised; PostgreSQL:
  a pooled connection's transaction, where ``Dialect.for_update`` locks the rows a decision
  reads). It commits on exit and rolls back on any exception.
- ``durable=False`` (``_exec``, ``_atomic``) marks a write whose loss in a crash of the
  *database server* costs nothing lasting: a claim, a use count, a recall note, derived rows
  (summaries, sessions, facts and their marks) that are computed again, and a finished
  delivery: every part a transport sent is recorded durably first (``record_part``), so a
  finish lost with the server leaves a row whose parts are all recorded, which the next
  outbox round finishes without sending anything again. On PostgreSQL it
  commits without waiting for the WAL flush (``synchronous_commit = off``, a second pool);
  it is visible at once to every gateway, as any commit, and the next durable commit flushes
  it too (the WAL is one sequence). Everything a person or the outbox relies on (a message,
  an answer with its outbox row, a part sent, a forget) stays durable.
  SQLite ignores the flag (WAL with ``synchronous = NORMAL`` never waits for the disk at
  commit). A killed gateway loses nothing either way: a commit that returned is committed.
- ``_together(steps)`` runs independent write statements as one unit: on PostgreSQL ONE
  statement (the first ones as data-modifying ``WITH`` parts), one round trip and no
  BEGIN/COMMIT; on SQLite one ``_atomic`` transaction. The steps must not read each other's
  changes (PostgreSQL runs them on one snapshot).
- Only fragments that really differ live in ``Dialect``; anything both engines accept
  (``RETURNING``, ``INSERT ... ON CONFLICT DO NOTHING``, ``coalesce``) is written once.
- A write that is a held command's effect (``done=<held command id>``) marks the command done
  in its own transaction (``_command_done``): effect and mark commit together or not at all.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from bot.memory.records import HEARD_WINDOW_SECONDS
from bot.memory.vectors import VectorCache


@dataclass(frozen=True, slots=True)
class Dialect:
    """The SQL fragments that differ between the backends."""

    name: str  # "sqlite" or "postgres"
    for_update: str  # appended to a SELECT whose rows a transaction is about to change
    rekey_search: str  # extra SET item re-keying a moved message's search words (one ``?``)
    fresh: str  # how to get an empty store, for messages that ask for one
    skip_locked: str  # after a batch's id subquery: leave rows another gateway is deleting
    json_ids: str  # ``{col}``'s JSON list of ids as rows of one column ``{alias}``
    key_share: str  # in a subquery: keep the row from being deleted until the commit
    outbox_gateway: bool  # outbox rows record (and are listed by) the gateway that queued them
    # A common table expression's body with ``?`` for (conversation id, platform id, time): one
    # row when a user message with that platform id was not heard in this conversation within
    # ``HEARD_WINDOW_SECONDS`` (and, on PostgreSQL, the ``heard`` row that claims it for this
    # statement's transaction, across gateways); no row for a repeat.
    heard_fresh: str

    def in_ids(self, column: str, ids: Sequence[int]) -> tuple[str, tuple[Any, ...]]:
        """``column`` is one of ``ids``: one array parameter on PostgreSQL (one prepared
        statement for every length), a list of ``?`` on SQLite."""
        if self.name == "postgres":
            return f"{column} = ANY(?::bigint[])", ([int(i) for i in ids],)
        return f"{column} IN ({','.join('?' * len(ids))})", tuple(ids)

    def in_texts(self, column: str, values: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        """As ``in_ids``, for text values."""
        if self.name == "postgres":
            return f"{column} = ANY(?::text[])", ([str(v) for v in values],)
        return f"{column} IN ({','.join('?' * len(values))})", tuple(values)


SQLITE = Dialect(
    name="sqlite",
    for_update="",
    rekey_search="",
    fresh="a new state_dir",
    skip_locked="",
    json_ids="json_each({col}) {alias}",
    key_share="",
    outbox_gateway=False,
    heard_fresh=(
        "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM messages WHERE conversation_id = ? AND "
        f"platform_id = ? AND role = 'user' AND created_at >= ? - {HEARD_WINDOW_SECONDS!r})"
    ),
)
POSTGRES = Dialect(
    name="postgres",
    for_update=" FOR UPDATE",
    rekey_search=", search = meshsage_keyed(?, search)",
    fresh="a new database",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    json_ids="jsonb_array_elements_text({col}::jsonb) AS {alias}(value)",
    key_share=" FOR KEY SHARE",
    outbox_gateway=True,
    heard_fresh=(
        "INSERT INTO heard (conversation_id, platform_id, heard_at) VALUES (?, ?, ?) "
        "ON CONFLICT (conversation_id, platform_id) DO UPDATE SET heard_at = EXCLUDED.heard_at "
        f"WHERE heard.heard_at < EXCLUDED.heard_at - {HEARD_WINDOW_SECONDS!r} RETURNING 1"
    ),
)


class Tx(Protocol):
    """Queries on the one connection of an open transaction."""

    async def all(self, sql: str, params: Iterable[Any] = ()) -> Sequence[Any]: ...
    async def one(self, sql: str, params: Iterable[Any] = ()) -> Any: ...
    async def val(self, sql: str, params: Iterable[Any] = ()) -> Any: ...
    async def exec(self, sql: str, params: Iterable[Any] = ()) -> int: ...
    async def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...


class CoreBase:
    """What the core table families need from a backend (implemented by each base)."""

    dialect: ClassVar[Dialect]
    _vectors: VectorCache

    async def _all(self, sql: str, params: Iterable[Any] = ()) -> Sequence[Any]:
        raise NotImplementedError

    async def _one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """The first row, or None."""
        raise NotImplementedError

    async def _val(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """The first column of the first row, or None."""
        raise NotImplementedError

    async def _exec(self, sql: str, params: Iterable[Any] = (), *, durable: bool = True) -> int:
        """Run a statement in its own transaction; the number of rows it changed."""
        raise NotImplementedError

    def _atomic(self, *, durable: bool = True) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    async def _together(
        self, steps: Sequence[tuple[str, Sequence[Any]]], *, durable: bool = True
    ) -> int:
        """Run independent write statements as one unit (see the module docstring); the
        number of rows the last one changed."""
        if self.dialect.name == "postgres":
            parts = [f"s{i} AS ({sql})" for i, (sql, _) in enumerate(steps[:-1])]
            sql = (f"WITH {', '.join(parts)} " if parts else "") + steps[-1][0]
            args = [p for _, params in steps for p in params]
            return await self._exec(sql, args, durable=durable)
        async with self._atomic(durable=durable) as tx:
            n = 0
            for sql, params in steps:
                n = await tx.exec(sql, params)
            return n

    async def _command_done(self, tx: Tx, command_id: int | None) -> None:
        """In the transaction that writes a held command's effect: mark it done, so a replay
        after a kill tells its person instead of running it twice."""
        if command_id is not None:
            await tx.exec(
                "UPDATE held_commands SET done_at = ? WHERE id = ? AND done_at IS NULL",
                (time.time(), command_id),
            )

    def _insert_rows(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
    ) -> tuple[str, list[tuple[Any, ...]]]:
        """The INSERT statement and its rows for copying ``rows`` (values of ``columns``) into
        ``table`` as they are, with what the backend derives on write: a message's search
        words (``_search_column``), an outbox row's gateway (``Dialect.outbox_gateway``)."""
        cols, marks = list(columns), ["?"] * len(columns)
        if table == "outbox" and self.dialect.outbox_gateway and "gateway" not in columns:
            cols.append("gateway")  # rows copied from SQLite: this gateway's
            marks.append("?")
            rows = [(*r, self._claim_gateway()) for r in rows]
        if table == "messages" and rows:
            at = [columns.index(c) for c in ("conversation_id", "author", "text", "created_at")]
            derived = [self._search_column(*(r[i] for i in at)) for r in rows]
            if derived[0][0]:
                cols.append(derived[0][0])
                marks.append(derived[0][1])
                rows = [(*r, *d[2]) for r, d in zip(rows, derived, strict=True)]
        return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(marks)})", rows

    async def _bulk_insert(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
    ) -> None:
        """Copy ``rows`` into ``table`` in one transaction (``_insert_rows``'s statement per
        row; PostgreSQL overrides it with one statement per batch)."""
        sql, args = self._insert_rows(table, columns, rows)
        async with self._atomic() as tx:
            await tx.many(sql, args)

    def _search_column(
        self, conversation_id: int, author: str, text: str, created_at: float
    ) -> tuple[str, str, tuple[Any, ...]]:
        """What a new message row carries for full-text search, written in its INSERT: the
        column (``"search"``), its value expression (with ``?``) and their parameters.
        SQLite: ``("", "", ())``, nothing (its FTS triggers index the row)."""
        raise NotImplementedError

    async def _after_import(self, tx: Tx) -> None:
        """Called in the transaction that wrote rows with explicit ids (PostgreSQL moves its
        id sequences past them)."""
        raise NotImplementedError

    def _claim_gateway(self) -> str:
        """The gateway name in this process's claim owner token (``bot.memory.outbox_claims``)."""
        raise NotImplementedError

    async def _mark_erase(self, tx: Tx) -> None:
        """Inside a forget's transaction: record that an erase is due (SQLite's crash-safe
        scrub mark; nothing on PostgreSQL)."""
        raise NotImplementedError

    async def _erase(self) -> None:
        """After a forget commits: make the deletions physical (SQLite: rewrite the FTS index
        and truncate the WAL; PostgreSQL: VACUUM)."""
        raise NotImplementedError


_NUMBERED: dict[str, str] = {}


def numbered(sql: str) -> str:
    """``sql`` with each ``?`` outside string literals replaced by ``$1, $2, ...`` (memoised;
    a string that already uses ``$n`` comes back unchanged)."""
    done = _NUMBERED.get(sql)
    if done is not None:
        return done
    parts: list[str] = []
    n = 0
    quoted = False
    for ch in sql:
        if ch == "'":
            quoted = not quoted
        if ch == "?" and not quoted:
            n += 1
            parts.append(f"${n}")
        else:
            parts.append(ch)
    done = "".join(parts)
    _NUMBERED[sql] = done
    return done


def changed(status: str) -> int:
    """Rows changed, from a PostgreSQL command tag (``UPDATE 3``, ``INSERT 0 1``)."""
    tail = status.rpartition(" ")[2]
    return int(tail) if tail.isdigit() else 0


MAX_ID = (1 << 63) - 1  # above every row id on both backends (64-bit signed)
