"""What PostgreSQL derives when rows are written: each message's search words (in the same
INSERT, on every path: a turn's message, an answer, an import, ``migrate-store``), and id
sequences moved past ids copied in explicitly.

Invariant: a message never exists without its ``search`` column (the word table's trigger
reads it), whatever path wrote it.
"""

from __future__ import annotations

from typing import Any

from bot.memory.core.db import Tx
from bot.memory.postgres.base import PgBase, PgTx, advance_sequences
from bot.memory.postgres.words import fold, meta

# A message's search words, keyed by its conversation (see schema 002_keyed_search); ``?`` for
# the conversation id, the folded text and the folded meta line (author, date).
SEARCH_SQL = "meshsage_keyed(?::bigint, to_tsvector('meshsage', ?) || to_tsvector('meshsage', ?))"


class RowsMixin(PgBase):
    def _search_column(
        self, conversation_id: int, author: str, text: str, created_at: float
    ) -> tuple[str, str, tuple[Any, ...]]:
        return "search", SEARCH_SQL, (conversation_id, fold(text), fold(meta(author, created_at)))

    async def _after_import(self, tx: Tx) -> None:
        assert isinstance(tx, PgTx)
        await advance_sequences(tx.con)
