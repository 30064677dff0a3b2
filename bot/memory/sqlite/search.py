"""Full-text lookups and vectors: what retrieval ranks over, always scoped to one conversation.

Invariants:
- Term lookups read one conversation's rowid range only; ``bot.memory.core.search`` shapes
  the results (``search_terms``) and holds the reads that are the same on both backends.
- Vector search reads one conversation's vectors of one model, through an in-process matrix
  cache (``bot.memory.vectors``) changed only while ``self._lock`` is held: extended by
  ``add_vectors``, dropped by ``forget_person`` and retention, and cleared whenever another
  connection has written to the database (``PRAGMA data_version``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from bot.memory.core.search import VECTORS_SQL, SearchCoreMixin
from bot.memory.schema import FTS_STRIDE
from bot.memory.sqlite.base import SqliteBase
from bot.memory.vectors import VectorMatrix, as_vectors, pack


class SearchMixin(SearchCoreMixin, SqliteBase):
    # --- full-text search (bot.memory.core.search shapes what this finds) -----------------
    async def _term_matches(
        self, conversation_id: int, terms: Sequence[str], span: tuple[int, int], limit: int
    ) -> list[tuple[int, int]]:
        """FTS5: each term is its own quoted phrase, so FTS5 syntax in a term is plain text.
        The rowid range confines FTS5 to this conversation's slice of every doclist, and no
        ``bm25()`` is asked for (it would walk each term's doclist across every person's
        messages to count document frequencies)."""
        lo = conversation_id * FTS_STRIDE + span[0]
        hi = conversation_id * FTS_STRIDE + min(span[1], FTS_STRIDE)
        part = (
            "SELECT * FROM (SELECT {i}, rowid FROM messages_fts "
            "WHERE messages_fts MATCH ? AND rowid > ? AND rowid < ? LIMIT ?)"
        )
        sql = " UNION ALL ".join(part.format(i=i) for i in range(len(terms)))
        params: list[Any] = []
        for term in terms:
            params += ['"' + term.replace('"', '""') + '"', lo, hi, limit]
        rows = await self._all(sql, params)
        return [(int(i), int(rowid) - conversation_id * FTS_STRIDE) for i, rowid in rows]

    # --- vectors (memory.embeddings) --------------------------------------------------------
    async def add_vectors(self, rows: Sequence[tuple[int, int, str, Sequence[float]]]) -> int:
        """Store (message_id, conversation_id, model, vector) rows in one transaction, replacing
        a message's vector of any model; returns how many were stored. A message that is gone
        (forgotten or pruned meanwhile) or not in that conversation is skipped."""
        if not rows:
            return 0
        packed = [(model, len(vec), pack(vec), mid, cid) for mid, cid, model, vec in rows]
        async with self._atomic() as tx:
            cur = await tx.db.executemany(
                "INSERT OR REPLACE INTO message_vectors "
                "(message_id, conversation_id, model, dim, vector) "
                "SELECT id, conversation_id, ?, ?, ? FROM messages "
                "WHERE id = ? AND conversation_id = ?",
                packed,
            )
            stored = cur.rowcount
            by_conv: dict[int, list[tuple[int, str, Sequence[float]]]] = {}
            for mid, cid, model, vec in rows:
                by_conv.setdefault(cid, []).append((mid, model, vec))
            for cid, items in by_conv.items():
                items.sort(key=lambda item: item[0])
                models = {model for _, model, _ in items}
                dims = {len(vec) for _, _, vec in items}
                if stored != len(rows) or len(models) != 1 or len(dims) != 1:
                    self._vectors.drop([cid])  # unusual; the next search reloads
                    continue
                self._vectors.added(
                    cid,
                    model=items[0][1],
                    ids=[mid for mid, _, _ in items],
                    vectors=as_vectors([vec for _, _, vec in items]),
                )
        return stored

    async def _vector_matrix(self, conversation_id: int, model: str) -> VectorMatrix | None:
        async with self._lock:
            cur = await self._db.execute("PRAGMA data_version")
            row = await cur.fetchone()
            version = int(row[0]) if row else None
            if version != self._data_version:  # another connection wrote: trust nothing cached
                self._vectors.clear()
                self._data_version = version
            matrix = self._vectors.get(conversation_id, model)
            if matrix is None:
                rows = await self._db.execute_fetchall(VECTORS_SQL, (conversation_id, model))
                # ~10-20 ms of copying for 6,000 x 768: off the event loop (numpy drops the GIL)
                matrix = await asyncio.to_thread(VectorMatrix.from_rows, model, rows)
                if matrix is None:
                    return None
                self._vectors.put(conversation_id, matrix)
        return matrix
