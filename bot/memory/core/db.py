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
- Only fragments that really differ live in ``Dialect``; anything both engines accept
  (``RETURNING``, ``INSERT ... ON CONFLICT DO NOTHING``, ``coalesce``) is written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

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

    async def _exec(self, sql: str, params: Iterable[Any] = ()) -> int:
        """Run a statement in its own transaction; the number of rows it changed."""
        raise NotImplementedError

    def _atomic(self) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    def _insert_rows(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
    ) -> tuple[str, list[tuple[Any, ...]]]:
        """The INSERT statement and its rows for copying ``rows`` (values of ``columns``) into
        ``table`` as they are; a backend adds what it derives on write (PostgreSQL: a message's
        search words)."""
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
