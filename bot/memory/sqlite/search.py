"""Full-text lookups and vectors: what retrieval ranks over, always scoped to one conversation.

Invariants:
- ``search_terms`` and ``outline`` read one conversation's rowid range only.
- Vector search reads one conversation's vectors of one model, through an in-process matrix
  cache (``bot.memory.vectors``) changed only while ``self._lock`` is held: extended by
  ``add_vectors``, dropped by ``forget_person`` and retention, and cleared whenever another
  connection has written to the database (``PRAGMA data_version``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from bot.memory.records import MSG_COLS, StoredMessage, msg_from_row
from bot.memory.schema import FTS_STRIDE
from bot.memory.sqlite.base import SqliteBase
from bot.memory.vectors import VectorMatrix, as_vectors, pack, unit


class SearchMixin(SqliteBase):
    # --- full-text search -------------------------------------------------------------------
    async def search_terms(
        self,
        conversation_id: int,
        terms: Sequence[str],
        *,
        after_id: int,
        before_id: int,
        limit_per_term: int = 5000,
    ) -> list[list[int]]:
        """For each term, the ids of this conversation's messages in (after_id, before_id) whose
        text or meta (author, date) contains it, as FTS5 tokenizes and stems it.

        One round trip; each term is its own quoted phrase, so FTS5 syntax in a term is plain
        text. The rowid range confines FTS5 to this conversation's slice of every doclist, and
        no ``bm25()`` is asked for (it would walk each term's doclist across every person's
        messages to count document frequencies): ranking happens in ``bot.memory.retrieval``
        with this conversation's own statistics.
        """
        if not terms:
            return []
        lo = conversation_id * FTS_STRIDE + after_id
        hi = conversation_id * FTS_STRIDE + min(before_id, FTS_STRIDE)
        part = (
            "SELECT * FROM (SELECT {i}, rowid FROM messages_fts "
            "WHERE messages_fts MATCH ? AND rowid > ? AND rowid < ? LIMIT ?)"
        )
        sql = " UNION ALL ".join(part.format(i=i) for i in range(len(terms)))
        params: list[Any] = []
        for term in terms:
            params += ['"' + term.replace('"', '""') + '"', lo, hi, limit_per_term]
        out: list[list[int]] = [[] for _ in terms]
        for i, rowid in await self._all(sql, params):
            out[int(i)].append(int(rowid) - conversation_id * FTS_STRIDE)
        return out

    async def outline(
        self, conversation_id: int, *, after_id: int, before_id: int
    ) -> list[tuple[int, str, int]]:
        """(id, role, tokens) of this conversation's messages in (after_id, before_id), in
        order: the shape retrieval ranks over (lengths, neighbours, question/answer pairs)."""
        rows = await self._all(
            "SELECT id, role, tokens FROM messages WHERE conversation_id = ? AND id > ? "
            "AND id < ? ORDER BY id",
            (conversation_id, after_id, min(before_id, FTS_STRIDE)),
        )
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    # --- vectors (memory.embeddings) --------------------------------------------------------
    async def add_vectors(self, rows: Sequence[tuple[int, int, str, Sequence[float]]]) -> int:
        """Store (message_id, conversation_id, model, vector) rows in one transaction, replacing
        a message's vector of any model; returns how many were stored. A message that is gone
        (forgotten or pruned meanwhile) or not in that conversation is skipped."""
        if not rows:
            return 0
        packed = [(model, len(vec), pack(vec), mid, cid) for mid, cid, model, vec in rows]
        async with self._tx() as db:
            cur = await db.executemany(
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

    async def messages_missing_vectors(
        self, model: str, *, limit: int, conversation_id: int | None = None, after_id: int = 0
    ) -> list[StoredMessage]:
        """Messages after their conversation's reset mark with no vector from ``model``,
        oldest first, ids above ``after_id`` (a cursor for paging through a backfill)."""
        scope = "AND m.conversation_id = ? " if conversation_id is not None else ""
        params: list[Any] = [after_id]
        if conversation_id is not None:
            params.append(conversation_id)
        cols = ", ".join(f"m.{c.strip()}" for c in MSG_COLS.split(","))
        rows = await self._all(
            f"SELECT {cols} FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE m.id > ? {scope}AND m.id > c.reset_after AND NOT EXISTS "
            "(SELECT 1 FROM message_vectors v WHERE v.message_id = m.id AND v.model = ?) "
            "ORDER BY m.id LIMIT ?",
            (*params, model, limit),
        )
        return [msg_from_row(r) for r in rows]

    async def vector_search(
        self,
        conversation_id: int,
        query: Sequence[float],
        *,
        model: str,
        after_id: int,
        before_id: int,
        limit: int,
    ) -> list[tuple[int, float]]:
        """(message id, cosine similarity) best first, among this conversation's messages with
        after_id < id < before_id that have a vector from ``model``. Never reads another
        conversation's vectors; the conversation's matrix is cached between calls."""
        q = unit(as_vectors(query))
        if limit <= 0 or q.ndim != 1 or not q.any():
            return []
        async with self._lock:
            cur = await self._db.execute("PRAGMA data_version")
            row = await cur.fetchone()
            version = int(row[0]) if row else None
            if version != self._data_version:  # another connection wrote: trust nothing cached
                self._vectors.clear()
                self._data_version = version
            matrix = self._vectors.get(conversation_id, model)
            if matrix is None:
                rows = await self._db.execute_fetchall(
                    "SELECT message_id, dim, vector FROM message_vectors "
                    "WHERE conversation_id = ? AND model = ? ORDER BY message_id",
                    (conversation_id, model),
                )
                # ~10-20 ms of copying for 6,000 x 768: off the event loop (numpy drops the GIL)
                matrix = await asyncio.to_thread(VectorMatrix.from_rows, model, rows)
                if matrix is None:
                    return []
                self._vectors.put(conversation_id, matrix)
        return matrix.search(q, after_id=after_id, before_id=before_id, limit=limit)
