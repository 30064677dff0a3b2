"""What retrieval reads, shaped once for both backends: term postings, the outline of a
conversation, and the messages a model has not embedded yet.

Invariants:
- Every read is scoped to one conversation's ids in (after_id, before_id); ids come back in
  ascending order, so ranking (``bot.memory.retrieval``, with this conversation's own
  statistics) sees the same postings on both backends.
- ``vector_search`` scores in process against the conversation's matrix of one model
  (``bot.memory.vectors``); the backend only keeps that matrix current (``_vector_matrix``).
- ``search_terms`` returns one list per term, in the terms' order, each at most
  ``limit_per_term`` ids. Which messages a term matches is the backend's full-text search
  (``_term_matches``: FTS5 on SQLite, the ``message_words`` table on PostgreSQL); nothing else
  about it differs.
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.memory.core.db import MAX_ID, CoreBase
from bot.memory.core.messages import M_COLS
from bot.memory.records import StoredMessage, msg_from_row
from bot.memory.vectors import VectorMatrix, as_vectors, unit

TERM_LIMIT = 5000  # ids per term at the most (retrieval ranks over these)
# One conversation's vectors of one model, in id order: what a cached matrix is built from.
VECTORS_SQL = (
    "SELECT message_id, dim, vector FROM message_vectors "
    "WHERE conversation_id = ? AND model = ? ORDER BY message_id"
)


class SearchCoreMixin(CoreBase):
    async def search_terms(
        self,
        conversation_id: int,
        terms: Sequence[str],
        *,
        after_id: int,
        before_id: int,
        limit_per_term: int = TERM_LIMIT,
    ) -> list[list[int]]:
        """For each term, the ids of this conversation's messages in (after_id, before_id) whose
        text or meta (author, date) contains it, as the backend tokenizes and stems it (a term
        is one quoted phrase: search syntax in it is plain text). One round trip for all."""
        out: list[list[int]] = [[] for _ in terms]
        if not terms or limit_per_term <= 0:
            return out
        span = (after_id, min(before_id, MAX_ID))
        for i, message_id in await self._term_matches(conversation_id, terms, span, limit_per_term):
            out[i].append(message_id)
        return out

    async def _term_matches(
        self, conversation_id: int, terms: Sequence[str], span: tuple[int, int], limit: int
    ) -> list[tuple[int, int]]:
        """(term index, message id) for each match among the conversation's ids inside ``span``
        (after, before: both excluded), ids ascending within a term, at most ``limit`` per term
        (the backend's full-text search; ``terms`` is not empty)."""
        raise NotImplementedError

    async def outline(
        self, conversation_id: int, *, after_id: int, before_id: int
    ) -> list[tuple[int, str, int]]:
        """(id, role, tokens) of this conversation's messages in (after_id, before_id), in
        order: the shape retrieval ranks over (lengths, neighbours, question/answer pairs)."""
        rows = await self._all(
            "SELECT id, role, tokens FROM messages WHERE conversation_id = ? AND id > ? "
            "AND id < ? ORDER BY id",
            (conversation_id, after_id, min(before_id, MAX_ID)),
        )
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    async def messages_missing_vectors(
        self, model: str, *, limit: int, conversation_id: int | None = None, after_id: int = 0
    ) -> list[StoredMessage]:
        """Messages after their conversation's reset mark with no vector from ``model``,
        oldest first, ids above ``after_id`` (a cursor for paging through a backfill)."""
        scope, args = "", [after_id]
        if conversation_id is not None:
            scope, args = "AND m.conversation_id = ? ", [after_id, conversation_id]
        rows = await self._all(
            f"SELECT {M_COLS} FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE m.id > ? {scope}AND m.id > c.reset_after AND NOT EXISTS "
            "(SELECT 1 FROM message_vectors v WHERE v.message_id = m.id AND v.model = ?) "
            "ORDER BY m.id LIMIT ?",
            (*args, model, limit),
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
        matrix = await self._vector_matrix(conversation_id, model)
        if matrix is None:
            return []
        return matrix.search(q, after_id=after_id, before_id=before_id, limit=limit)

    async def _vector_matrix(self, conversation_id: int, model: str) -> VectorMatrix | None:
        """The conversation's vectors of ``model`` (``VECTORS_SQL``) as the cached matrix,
        reloaded when the database changed under it; None when there are none."""
        raise NotImplementedError
