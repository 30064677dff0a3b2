"""What PostgreSQL derives when rows are copied in with their ids (imports, ``migrate-store``):
each message's search words, the gateway of outbox rows copied from SQLite (this one), and id
sequences moved past the copied ids.

Invariant: a message never exists without its ``search`` column (the word table's trigger
reads it), whatever path wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bot.memory.core.db import Tx
from bot.memory.postgres.base import PgBase, PgTx, advance_sequences
from bot.memory.postgres.messages import SEARCH_SQL
from bot.memory.postgres.words import fold, meta


class RowsMixin(PgBase):
    def _insert_rows(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
    ) -> tuple[str, list[tuple[Any, ...]]]:
        cols, values = list(columns), [f"${i}" for i in range(1, len(columns) + 1)]
        if table == "outbox" and "gateway" not in columns:  # migrated rows: this gateway's
            cols.append("gateway")
            values.append(f"${len(columns) + 1}")
            rows = [(*r, self.gateway) for r in rows]
        if table == "messages":
            text, author, created = (columns.index(c) for c in ("text", "author", "created_at"))
            n = len(columns)
            cols.append("search")
            conv = columns.index("conversation_id") + 1
            values.append(SEARCH_SQL.format(c=conv, a=n + 1, b=n + 2))
            rows = [(*r, fold(r[text]), fold(meta(r[author], r[created]))) for r in rows]
        return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(values)})", rows

    async def _after_import(self, tx: Tx) -> None:
        assert isinstance(tx, PgTx)
        await advance_sequences(tx.con)
