"""Sessions and long-term summaries: the tiers above the raw log (both backends).

Invariants:
- A session covers the messages of one conversation from ``first_message_id`` to
  ``last_message_id`` (ids, not times: a clock that jumps backwards cannot reorder them);
  sessions of a conversation never overlap, and a new one starts after the newest one's end.
  On PostgreSQL ``add_sessions`` first locks the conversation row, so two gateways closing the
  same session at once record it once (the other skips it); SQLite's ``BEGIN IMMEDIATE``
  already serialises writers.
- A session's title and summary are written once, later, by the background summarizer.
- Long-term summaries are versions: each covers the sessions up to ``up_to_message_id``; the
  newest ``LONGTERM_VERSIONS`` are kept, so a prompt can keep one version until its window
  moves on (cache-stable) while newer ones wait.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bot.memory.core.db import MAX_ID, CoreBase
from bot.memory.records import LongTermSummary, Session, SessionSpan

LONGTERM_VERSIONS = 8
INSERT_BATCH = 50  # sessions per INSERT statement (a bounded set of distinct statements)
SESSION_COLS = (
    "id, conversation_id, first_message_id, last_message_id, started_at, ended_at, messages, "
    "title, summary, tokens"
)


class SessionsMixin(CoreBase):
    async def sessions(self, conversation_id: int, *, limit: int = 1000) -> list[Session]:
        """The newest ``limit`` sessions, oldest first."""
        rows = await self._all(
            f"SELECT {SESSION_COLS} FROM (SELECT * FROM sessions WHERE conversation_id = ? "
            "ORDER BY last_message_id DESC LIMIT ?) s ORDER BY last_message_id",
            (conversation_id, limit),
        )
        return [Session(*r) for r in rows]

    async def session_end(self, conversation_id: int) -> int:
        """The last message id covered by a session (0 if none)."""
        value = await self._val(
            "SELECT coalesce(max(last_message_id), 0) FROM sessions WHERE conversation_id = ?",
            (conversation_id,),
        )
        return int(value or 0)

    async def add_session(
        self,
        conversation_id: int,
        *,
        first_message_id: int,
        last_message_id: int,
        started_at: float,
        ended_at: float,
        messages: int,
    ) -> int | None:
        """Record a closed session; None if it would overlap one already recorded."""
        span = SessionSpan(first_message_id, last_message_id, started_at, ended_at, messages)
        ids = await self.add_sessions(conversation_id, [span])
        return ids[0] if ids else None

    async def add_sessions(self, conversation_id: int, spans: Sequence[SessionSpan]) -> list[int]:
        """Record closed sessions (in message order, not overlapping each other) in one
        transaction; those that would overlap one already recorded are skipped. Returns the
        new ids, in order. One lock, one check and one insert per ``INSERT_BATCH`` spans: a
        conversation's backlog of sessions costs one commit, not one each."""
        if not spans:
            return []
        async with self._atomic(durable=False) as tx:  # derived from messages: found again
            if self.dialect.for_update:
                await tx.exec(
                    "SELECT 1 FROM conversations WHERE id = ?" + self.dialect.for_update,
                    (conversation_id,),
                )
            end = await tx.val(
                "SELECT coalesce(max(last_message_id), 0) FROM sessions WHERE conversation_id = ?",
                (conversation_id,),
            )
            todo = [s for s in spans if s.first_message_id > int(end)]
            ids: list[int] = []
            for i in range(0, len(todo), INSERT_BATCH):
                batch = todo[i : i + INSERT_BATCH]
                rows = await tx.all(
                    "INSERT INTO sessions (conversation_id, first_message_id, last_message_id, "
                    "started_at, ended_at, messages) VALUES "
                    + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(batch))
                    + " RETURNING id",
                    [v for s in batch for v in (conversation_id, s.first_message_id,
                     s.last_message_id, s.started_at, s.ended_at, s.messages)],
                )  # fmt: skip
                ids += sorted(int(r[0]) for r in rows)
            return ids

    async def set_session_summary(
        self, session_id: int, *, title: str, summary: str, tokens: int
    ) -> bool:
        changed = await self._exec(
            "UPDATE sessions SET title = ?, summary = ?, tokens = ? WHERE id = ?",
            (title, summary, tokens, session_id),
            durable=False,
        )
        return changed > 0

    async def clear_sessions(self, conversation_id: int) -> int:
        """Drop every session and the long-term summary (``memory rebuild``)."""
        async with self._atomic() as tx:
            n = await tx.exec("DELETE FROM sessions WHERE conversation_id = ?", (conversation_id,))
            await tx.exec(
                "DELETE FROM longterm_summaries WHERE conversation_id = ?", (conversation_id,)
            )
            return n

    async def unsummarized_sessions(self, *, limit: int, ended_after: float = 0.0) -> list[Session]:
        rows = await self._all(
            f"SELECT {SESSION_COLS} FROM sessions WHERE summary IS NULL AND ended_at >= ? "
            "ORDER BY id LIMIT ?",
            (ended_after, limit),
        )
        return [Session(*r) for r in rows]

    async def idle_conversations(self, *, idle_before: float, limit: int) -> list[int]:
        """Conversations with messages after their last session whose newest message is older
        than ``idle_before`` or at/below their reset mark (``!reset`` closes a session)."""
        rows = await self._all(
            "SELECT c.id FROM conversations c "
            "JOIN messages m ON m.id = (SELECT max(id) FROM messages WHERE conversation_id = c.id) "
            "WHERE c.merged_into IS NULL AND m.id > coalesce((SELECT max(last_message_id) "
            "FROM sessions s WHERE s.conversation_id = c.id), 0) "
            "AND (m.created_at <= ? OR c.reset_after >= m.id) ORDER BY c.id LIMIT ?",
            (idle_before, limit),
        )
        return [int(r[0]) for r in rows]

    async def longterm_summary(
        self,
        conversation_id: int,
        *,
        up_to: int | None = None,
        written_before: float | None = None,
    ) -> LongTermSummary | None:
        """The newest version; with ``up_to``, the newest covering no message after it; with
        ``written_before``, the newest that already existed then."""
        row = await self._one(
            "SELECT text, tokens, sessions, up_to_message_id, updated_at FROM longterm_summaries "
            "WHERE conversation_id = ? AND up_to_message_id <= ? AND updated_at <= ? "
            "ORDER BY up_to_message_id DESC, id DESC LIMIT 1",
            (
                conversation_id,
                MAX_ID if up_to is None else up_to,
                float("inf") if written_before is None else written_before,
            ),
        )
        return None if row is None else LongTermSummary(*row)

    async def has_longterm_summary(self, conversation_id: int) -> bool:
        value = await self._val(
            "SELECT 1 FROM longterm_summaries WHERE conversation_id = ? LIMIT 1",
            (conversation_id,),
        )
        return value is not None

    async def save_longterm_summary(
        self,
        conversation_id: int,
        *,
        text: str,
        tokens: int,
        sessions: int,
        up_to_message_id: int,
        updated_at: float | None = None,
    ) -> None:
        """Add a version; only the newest ``LONGTERM_VERSIONS`` are kept."""
        async with self._atomic(durable=False) as tx:  # derived: computed again if lost
            await tx.exec(
                "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions, "
                "up_to_message_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, text, tokens, sessions, up_to_message_id,
                 time.time() if updated_at is None else updated_at),
            )  # fmt: skip
            await tx.exec(
                "DELETE FROM longterm_summaries WHERE conversation_id = ? AND id NOT IN "
                "(SELECT id FROM longterm_summaries WHERE conversation_id = ? "
                "ORDER BY up_to_message_id DESC, id DESC LIMIT ?)",
                (conversation_id, conversation_id, LONGTERM_VERSIONS),
            )
