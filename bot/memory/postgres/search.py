"""Full-text lookups and vectors on PostgreSQL: what retrieval ranks over, always scoped to one
conversation.

Invariants:
- Term lookups read one conversation's id range only; ``bot.memory.core.search`` shapes the
  results (``search_terms``) and holds the reads that are the same on both backends; ranking
  happens in ``bot.memory.retrieval`` with that conversation's own statistics.
- A term matches where FTS5 would match it as a quoted phrase: it is folded like the text
  (``words.fold``) and stemmed as the stored words are; its words are looked up in
  ``message_words`` (schema ``009_pg_word_index``), keyed by conversation, so a lookup reads
  this conversation's entries for the word only, from the index alone, never every person's.
- Ids come back in ascending order for each term (as from FTS5), so ranking sees the same
  postings on both backends; retrieval's tie-break (score, then the newer id) does the rest.
- Vector search runs in process (``bot.memory.vectors``), as on SQLite: vectors are stored as
  float32 bytes, and a conversation's cached matrix is used only while that conversation's
  vectors of that model still have the same count and id sum and maximum in the database
  (another gateway may have added or deleted some); otherwise it is reloaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bot.memory.core.search import VECTORS_SQL, SearchCoreMixin
from bot.memory.postgres.base import PgBase
from bot.memory.postgres.words import fold
from bot.memory.vectors import VectorMatrix, pack

# One round trip for all terms. A term whose phrase query is one word is looked up in
# ``message_words`` alone: an index-only range scan of the primary key (conversation, word,
# message id), in id order, that never reads the messages heap (schema 009_pg_word_index). A
# phrase of several words takes its first word's matches from the same index and keeps those
# whose ``search`` holds the phrase (keyed by this conversation, as the stored words are), so
# only those candidate rows are read. Ids come in ascending order, as FTS5 returns rowids.
# Folded text holds only letters and digits, so a lexeme never contains a quote.
_TERM_SQL = r"""
SELECT t.i, m.id FROM (
    SELECT i, pq, (regexp_match(pq::text, '''([^'']+)'''))[1] AS first, numnode(pq) = 1 AS single
    FROM unnest($1::int[], $2::text[]) AS u(i, q),
    LATERAL phraseto_tsquery('meshsage', q) AS pq
) t
CROSS JOIN LATERAL (
    SELECT w.message_id AS id FROM message_words w
    WHERE w.conversation_id = $3 AND w.word = t.first AND w.message_id > $4
    AND w.message_id < $5 AND (t.single OR EXISTS (
        SELECT 1 FROM messages x WHERE x.id = w.message_id AND x.search @@ regexp_replace(
            t.pq::text, '''([^'']+)''', '''' || $3::text || '_\1''', 'g')::tsquery))
    ORDER BY w.message_id LIMIT $6
) m
"""


class SearchMixin(SearchCoreMixin, PgBase):
    # --- full-text search (bot.memory.core.search shapes what this finds) -----------------
    async def _term_matches(
        self, conversation_id: int, terms: Sequence[str], span: tuple[int, int], limit: int
    ) -> list[tuple[int, int]]:
        """The word table, stemmed as the stored words are. One round trip for all terms."""
        folded = [fold(t) for t in terms]
        asked = [i for i, f in enumerate(folded) if f]  # nothing left: FTS5 matches nothing too
        if not asked:
            return []
        rows = await self._all(
            _TERM_SQL,
            (
                asked,
                [folded[i] for i in asked],
                conversation_id,
                span[0],
                span[1],
                limit,
            ),
        )
        return [(int(i), int(mid)) for i, mid in rows]

    # --- vectors (memory.embeddings) --------------------------------------------------------
    async def add_vectors(self, rows: Sequence[tuple[int, int, str, Sequence[float]]]) -> int:
        """Store (message_id, conversation_id, model, vector) rows in one transaction, replacing
        a message's vector of any model; returns how many were stored. A message that is gone
        or not in that conversation is skipped."""
        if not rows:
            return 0
        async with self._atomic() as tx:
            stored = await tx.con.fetchval(
                "WITH new AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], "
                "$4::int[], $5::bytea[]) AS n(mid, cid, model, dim, vec)), "
                "ins AS (INSERT INTO message_vectors "
                "(message_id, conversation_id, model, dim, vector) "
                "SELECT m.id, m.conversation_id, n.model, n.dim, n.vec FROM new n "
                "JOIN messages m ON m.id = n.mid AND m.conversation_id = n.cid "
                "ON CONFLICT (message_id) DO UPDATE SET model = EXCLUDED.model, "
                "dim = EXCLUDED.dim, vector = EXCLUDED.vector, "
                "conversation_id = EXCLUDED.conversation_id RETURNING 1) "
                "SELECT count(*) FROM ins",
                [r[0] for r in rows],
                [r[1] for r in rows],
                [r[2] for r in rows],
                [len(r[3]) for r in rows],
                [pack(r[3]) for r in rows],
            )
        self._vectors.drop({cid for _, cid, _, _ in rows})  # the next search reloads
        return int(stored)

    async def _vector_matrix(self, conversation_id: int, model: str) -> VectorMatrix | None:
        row = await self._one(
            "SELECT count(*), coalesce(sum(message_id), 0), coalesce(max(message_id), 0) "
            "FROM message_vectors WHERE conversation_id = $1 AND model = $2",
            (conversation_id, model),
        )
        assert row is not None
        mark = (int(row[0]), int(row[1]), int(row[2]))
        matrix = self._vectors.get(conversation_id, model)
        if matrix is None or self._vector_marks.get((conversation_id, model)) != mark:
            rows = await self._all(VECTORS_SQL, (conversation_id, model))
            matrix = await asyncio.to_thread(
                VectorMatrix.from_rows, model, [tuple(r) for r in rows]
            )
            if matrix is None:
                return None
            self._vectors.put(conversation_id, matrix)
            self._vector_marks[(conversation_id, model)] = mark
        return matrix
