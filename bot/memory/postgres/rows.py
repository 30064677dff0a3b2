"""What PostgreSQL derives when rows are written: each message's search words (in the same
INSERT, on every path: a turn's message, an answer, an import, ``migrate-store``), and id
sequences moved past ids copied in explicitly.

Invariants:
- A message never exists without its ``search`` column (the word table's trigger reads it),
  whatever path wrote it.
- A batch of copied rows (``import_rows``: ``migrate-store``, the benchmarks' loads) is ONE
  ``INSERT ... SELECT FROM unnest(...)`` with one array parameter per column: the word table's
  statement trigger fires once per batch, not once per row, and the batch is one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bot.memory.core.db import Tx
from bot.memory.postgres.base import PgBase, PgTx, advance_sequences
from bot.memory.postgres.words import fold, meta

# A message's search words, keyed by its conversation (see schema 002_keyed_search); ``?`` for
# the conversation id, the folded text and the folded meta line (author, date).
SEARCH_SQL = "meshsage_keyed(?::bigint, to_tsvector('meshsage', ?) || to_tsvector('meshsage', ?))"
_TYPES = (
    "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
    "WHERE attrelid = ?::regclass AND attnum > 0 AND NOT attisdropped"
)


class RowsMixin(PgBase):
    def _search_column(
        self, conversation_id: int, author: str, text: str, created_at: float
    ) -> tuple[str, str, tuple[Any, ...]]:
        return "search", SEARCH_SQL, (conversation_id, fold(text), fold(meta(author, created_at)))

    async def _bulk_insert(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
    ) -> None:
        if not rows:
            return
        types = {str(r[0]): str(r[1]) for r in await self._all(_TYPES, (table,))}
        cols = list(columns)
        arrays: list[list[Any]] = [list(c) for c in zip(*rows, strict=True)]
        if table == "outbox" and "gateway" not in cols:
            cols.append("gateway")  # rows copied from SQLite: this gateway's
            arrays.append([self._claim_gateway()] * len(rows))
        exprs = [f"u.c{i}" for i in range(len(cols))]
        casts = [f"?::{types[c]}[]" for c in cols]
        if table == "messages":
            at = [columns.index(c) for c in ("conversation_id", "author", "text", "created_at")]
            folded = [self._search_column(*(r[i] for i in at))[2] for r in rows]
            arrays += [[f[1] for f in folded], [f[2] for f in folded]]
            casts += ["?::text[]", "?::text[]"]
            conv = exprs[cols.index("conversation_id")]
            n = len(cols)
            cols.append("search")
            exprs.append(SEARCH_SQL.replace("?::bigint", conv, 1).replace("?", f"u.c{n}", 1)
                         .replace("?", f"u.c{n + 1}", 1))  # fmt: skip
        names = ", ".join(f"c{i}" for i in range(len(arrays)))
        sql = (
            f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} "
            f"FROM unnest({', '.join(casts)}) AS u({names})"
        )
        async with self._atomic() as tx:
            await tx.exec(sql, arrays)

    async def _after_import(self, tx: Tx) -> None:
        assert isinstance(tx, PgTx)
        await advance_sequences(tx.con)
