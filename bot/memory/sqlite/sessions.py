"""Sessions and long-term summaries: the tiers above the raw log.

Invariants:
- A session covers the messages of one conversation from ``first_message_id`` to
  ``last_message_id`` (ids, not times: a clock that jumps backwards cannot reorder them);
  sessions of a conversation never overlap, and a new one starts after the newest one's end.
- A session's title and summary are written once, later, by the background summarizer.
- Long-term summaries are versions: each covers the sessions up to ``up_to_message_id``; the
  newest ``LONGTERM_VERSIONS`` are kept, so a prompt can keep one version until its window
  moves on (cache-stable) while newer ones wait.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bot.memory.records import LongTermSummary, Session
from bot.memory.schema import FTS_STRIDE
from bot.memory.sqlite.base import SqliteBase

LONGTERM_VERSIONS = 8
SESSION_COLS = (
    "id, conversation_id, first_message_id, last_message_id, started_at, ended_at, messages, "
    "title, summary, tokens"
)


def _session(row: Sequence[Any]) -> Session:
    return Session(*row)


class SessionsMixin(SqliteBase):
    async def sessions(self, conversation_id: int, *, limit: int = 1000) -> list[Session]:
        """The newest ``limit`` sessions, oldest first."""
        rows = await self._all(
            f"SELECT {SESSION_COLS} FROM (SELECT * FROM sessions WHERE conversation_id = ? "
            "ORDER BY last_message_id DESC LIMIT ?) ORDER BY last_message_id",
            (conversation_id, limit),
        )
        return [_session(r) for r in rows]

    async def session_end(self, conversation_id: int) -> int:
        """The last message id covered by a session (0 if none)."""
        row = await self._one(
            "SELECT coalesce(max(last_message_id), 0) FROM sessions WHERE conversation_id = ?",
            (conversation_id,),
        )
        return int(row[0]) if row else 0

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
        async with self._tx() as db:
            cur = await db.execute(
                "SELECT 1 FROM sessions WHERE conversation_id = ? AND last_message_id >= ?",
                (conversation_id, first_message_id),
            )
            if await cur.fetchone() is not None:
                return None
            cur = await db.execute(
                "INSERT INTO sessions (conversation_id, first_message_id, last_message_id, "
                "started_at, ended_at, messages) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, first_message_id, last_message_id, started_at, ended_at,
                 messages),
            )  # fmt: skip
            assert cur.lastrowid is not None
            return cur.lastrowid

    async def set_session_summary(
        self, session_id: int, *, title: str, summary: str, tokens: int
    ) -> bool:
        async with self._tx() as db:
            cur = await db.execute(
                "UPDATE sessions SET title = ?, summary = ?, tokens = ? WHERE id = ?",
                (title, summary, tokens, session_id),
            )
            return cur.rowcount > 0

    async def clear_sessions(self, conversation_id: int) -> int:
        """Drop every session and the long-term summary (``memory rebuild``)."""
        async with self._tx() as db:
            cur = await db.execute(
                "DELETE FROM sessions WHERE conversation_id = ?", (conversation_id,)
            )
            await db.execute(
                "DELETE FROM longterm_summaries WHERE conversation_id = ?", (conversation_id,)
            )
            return cur.rowcount

    async def unsummarized_sessions(self, *, limit: int, ended_after: float = 0.0) -> list[Session]:
        rows = await self._all(
            f"SELECT {SESSION_COLS} FROM sessions WHERE summary IS NULL AND ended_at >= ? "
            "ORDER BY id LIMIT ?",
            (ended_after, limit),
        )
        return [_session(r) for r in rows]

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
                FTS_STRIDE if up_to is None else up_to,
                float("inf") if written_before is None else written_before,
            ),
        )
        return None if row is None else LongTermSummary(*row)

    async def has_longterm_summary(self, conversation_id: int) -> bool:
        row = await self._one(
            "SELECT 1 FROM longterm_summaries WHERE conversation_id = ? LIMIT 1",
            (conversation_id,),
        )
        return row is not None

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
        async with self._tx() as db:
            await db.execute(
                "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions, "
                "up_to_message_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, text, tokens, sessions, up_to_message_id,
                 time.time() if updated_at is None else updated_at),
            )  # fmt: skip
            await db.execute(
                "DELETE FROM longterm_summaries WHERE conversation_id = ? AND id NOT IN "
                "(SELECT id FROM longterm_summaries WHERE conversation_id = ? "
                "ORDER BY up_to_message_id DESC, id DESC LIMIT ?)",
                (conversation_id, conversation_id, LONGTERM_VERSIONS),
            )
