"""Sessions and long-term summaries on PostgreSQL: the tiers above the raw log.

Invariants (as ``bot.memory.sqlite.sessions``):
- Sessions of a conversation never overlap: ``add_session`` locks the conversation row, so two
  gateways closing the same session at once record it once (the other gets None).
- A session's title and summary are written once, later, by the background summarizer.
- Long-term summary versions: each records the last message its sessions cover; only the
  newest ``LONGTERM_VERSIONS`` are kept.
"""

from __future__ import annotations

import time

from bot.memory.postgres.base import PgBase
from bot.memory.postgres.messages import MAX_ID
from bot.memory.records import LongTermSummary, Session
from bot.memory.sqlite.sessions import LONGTERM_VERSIONS

SESSION_COLS = (
    "id, conversation_id, first_message_id, last_message_id, started_at, ended_at, messages, "
    "title, summary, tokens"
)


class SessionsMixin(PgBase):
    async def sessions(self, conversation_id: int, *, limit: int = 1000) -> list[Session]:
        """The newest ``limit`` sessions, oldest first."""
        rows = await self._all(
            f"SELECT {SESSION_COLS} FROM (SELECT * FROM sessions WHERE conversation_id = $1 "
            "ORDER BY last_message_id DESC LIMIT $2) s ORDER BY last_message_id",
            (conversation_id, limit),
        )
        return [Session(*r) for r in rows]

    async def session_end(self, conversation_id: int) -> int:
        """The last message id covered by a session (0 if none)."""
        value = await self._val(
            "SELECT coalesce(max(last_message_id), 0) FROM sessions WHERE conversation_id = $1",
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
        async with self._tx() as con:
            await con.execute(
                "SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE", conversation_id
            )
            taken = await con.fetchval(
                "SELECT 1 FROM sessions WHERE conversation_id = $1 AND last_message_id >= $2",
                conversation_id,
                first_message_id,
            )
            if taken is not None:
                return None
            new_id = await con.fetchval(
                "INSERT INTO sessions (conversation_id, first_message_id, last_message_id, "
                "started_at, ended_at, messages) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                conversation_id,
                first_message_id,
                last_message_id,
                started_at,
                ended_at,
                messages,
            )
            return int(new_id)

    async def set_session_summary(
        self, session_id: int, *, title: str, summary: str, tokens: int
    ) -> bool:
        value = await self._val(
            "UPDATE sessions SET title = $1, summary = $2, tokens = $3 WHERE id = $4 RETURNING id",
            (title, summary, tokens, session_id),
        )
        return value is not None

    async def clear_sessions(self, conversation_id: int) -> int:
        """Drop every session and the long-term summary (``memory rebuild``)."""
        async with self._tx() as con:
            n = await con.fetchval(
                "WITH gone AS (DELETE FROM sessions WHERE conversation_id = $1 RETURNING 1) "
                "SELECT count(*) FROM gone",
                conversation_id,
            )
            await con.execute(
                "DELETE FROM longterm_summaries WHERE conversation_id = $1", conversation_id
            )
            return int(n)

    async def unsummarized_sessions(self, *, limit: int, ended_after: float = 0.0) -> list[Session]:
        rows = await self._all(
            f"SELECT {SESSION_COLS} FROM sessions WHERE summary IS NULL AND ended_at >= $1 "
            "ORDER BY id LIMIT $2",
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
            "AND (m.created_at <= $1 OR c.reset_after >= m.id) ORDER BY c.id LIMIT $2",
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
            "WHERE conversation_id = $1 AND up_to_message_id <= $2 AND updated_at <= $3 "
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
            "SELECT 1 FROM longterm_summaries WHERE conversation_id = $1 LIMIT 1",
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
        async with self._tx() as con:
            await con.execute(
                "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions, "
                "up_to_message_id, updated_at) VALUES ($1, $2, $3, $4, $5, $6)",
                conversation_id, text, tokens, sessions, up_to_message_id,
                time.time() if updated_at is None else updated_at,
            )  # fmt: skip
            await con.execute(
                "DELETE FROM longterm_summaries WHERE conversation_id = $1 AND id NOT IN "
                "(SELECT id FROM longterm_summaries WHERE conversation_id = $1 "
                "ORDER BY up_to_message_id DESC, id DESC LIMIT $2)",
                conversation_id,
                LONGTERM_VERSIONS,
            )
