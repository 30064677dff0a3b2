"""Linked identities and incognito, per conversation.

Invariants:
- Only DM conversations link; a conversation is either a home, absorbed into one home
  (``merged_into``), or alone. Absorbed conversations keep their row (their key) and no rows.
- Linking moves the absorbed DM's messages, vectors, facts and sessions into the home and
  records ``origin_conversation_id`` on each; unlinking moves exactly those rows back (new
  messages that arrived through the absorbed side carry it too), so each side keeps its own.
  The FTS update trigger re-keys index rows when ``conversation_id`` changes.
- Rolling summaries stay where they were written. Linking keeps the home's long-term summary
  (or copies the other side's when the home has none); unlinking drops the home's (it mixed
  both sides) and it is rebuilt at the next session close.
"""

from __future__ import annotations

import time

import aiosqlite

from bot.domain import DM_SPACE, ConversationKey
from bot.errors import MemoryRefused
from bot.memory.sqlite.base import SqliteBase

_MOVED = ("messages", "facts", "sessions")


class LinkError(MemoryRefused):
    """A link that cannot be made; the message says why and what to do."""


class IdentityMixin(SqliteBase):
    async def link_dm(self, home: ConversationKey, other: ConversationKey) -> int:
        """Join ``other``'s DM memory into ``home``'s; returns the number of messages moved."""
        if home.space != DM_SPACE or other.space != DM_SPACE:
            raise LinkError("only direct messages can be linked; channel spaces never merge.")
        if home.transport == other.transport:
            raise LinkError("send the code from your account on the other transport.")
        async with self._tx() as db:
            ids = []
            for key in (home, other):
                await db.execute(
                    "INSERT OR IGNORE INTO conversations (transport, person, space, created_at) "
                    "VALUES (?, ?, ?, ?)",
                    (key.transport, key.person, key.space, time.time()),
                )
                cur = await db.execute(
                    "SELECT id, merged_into, (SELECT count(*) FROM conversations h "
                    "WHERE h.merged_into = c.id) FROM conversations c "
                    "WHERE transport = ? AND person = ? AND space = ?",
                    (key.transport, key.person, key.space),
                )
                row = await cur.fetchone()
                assert row is not None
                if row[1] is not None or row[2]:
                    raise LinkError(
                        "one of these accounts is already linked; send !unlink there first."
                    )
                ids.append(int(row[0]))
            home_id, other_id = ids
            cur = await db.execute(
                "UPDATE messages SET conversation_id = ?, origin_conversation_id = ? "
                "WHERE conversation_id = ?",
                (home_id, other_id, other_id),
            )
            moved = cur.rowcount
            for table in ("facts", "sessions"):
                await db.execute(
                    f"UPDATE {table} SET conversation_id = ?, origin_conversation_id = ? "
                    "WHERE conversation_id = ?",
                    (home_id, other_id, other_id),
                )
            await db.execute(
                "UPDATE message_vectors SET conversation_id = ? WHERE conversation_id = ?",
                (home_id, other_id),
            )
            await db.execute("UPDATE conversations SET merged_into = ? WHERE id = ?",
                             (home_id, other_id))  # fmt: skip
            # The long-term summary stays (the person's story so far); a home without one
            # starts from a copy of the other side's (which keeps its own for !unlink).
            await db.execute(
                "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions, "
                "up_to_message_id, updated_at) SELECT ?, text, tokens, sessions, "
                "up_to_message_id, updated_at FROM longterm_summaries WHERE conversation_id = ? "
                "AND NOT EXISTS (SELECT 1 FROM longterm_summaries WHERE conversation_id = ?) "
                "ORDER BY up_to_message_id DESC, id DESC LIMIT 1",
                (home_id, other_id, home_id),
            )
            self._vectors.drop([home_id, other_id])
        return moved

    async def unlink_dm(self, key: ConversationKey) -> int | None:
        """Separate the link ``key`` belongs to (from either side); returns the number of
        messages given back, or None when ``key`` is not linked."""
        async with self._tx() as db:
            cur = await db.execute(
                "SELECT id, merged_into FROM conversations "
                "WHERE transport = ? AND person = ? AND space = ?",
                (key.transport, key.person, key.space),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            if row[1] is not None:
                absorbed = [int(row[0])]
            else:
                cur = await db.execute(
                    "SELECT id FROM conversations WHERE merged_into = ?", (row[0],)
                )
                absorbed = [int(r[0]) for r in await cur.fetchall()]
            if not absorbed:
                return None
            moved = 0
            for other_id in absorbed:
                moved += await give_back(db, other_id)
            self._vectors.clear()
        return moved

    async def set_incognito(self, conversation_id: int, on: bool) -> None:
        async with self._tx() as db:
            await db.execute(
                "UPDATE conversations SET incognito = ? WHERE id = ?", (int(on), conversation_id)
            )

    async def is_incognito(self, conversation_id: int) -> bool:
        row = await self._one(
            "SELECT incognito FROM conversations WHERE id = ?", (conversation_id,)
        )
        return bool(row and row[0])

    # --- link codes (bot.memory.links decides; this is the SQL) ------------------------------
    async def save_link_code(
        self, code_hash: str, transport: str, person: str, *, expires_at: float, now: float
    ) -> bool:
        """Store a new code for the person (replacing theirs; expired ones go); False if the
        hash is taken by a live code (the caller draws another)."""
        async with self._tx() as db:
            await db.execute(
                "DELETE FROM link_codes WHERE expires_at <= ? OR (transport = ? AND person = ?)",
                (now, transport, person),
            )
            cur = await db.execute(
                "INSERT OR IGNORE INTO link_codes (code_hash, transport, person, expires_at) "
                "VALUES (?, ?, ?, ?)",
                (code_hash, transport, person, expires_at),
            )
            return cur.rowcount == 1

    async def take_link_code(
        self, code_hash: str, *, transport: str, now: float
    ) -> tuple[str, str] | None:
        """Spend a live code issued on another transport: (transport, person) or None."""
        async with self._tx() as db:
            cur = await db.execute(
                "DELETE FROM link_codes WHERE code_hash = ? AND expires_at > ? AND transport != ? "
                "RETURNING transport, person",
                (code_hash, now, transport),
            )
            row = await cur.fetchone()
            return None if row is None else (str(row[0]), str(row[1]))

    async def note_link_failure(self, transport: str, person: str, *, now: float) -> None:
        async with self._tx() as db:
            await db.execute("DELETE FROM link_failures WHERE at < ?", (now - 86_400,))
            await db.execute(
                "INSERT INTO link_failures (transport, person, at) VALUES (?, ?, ?)",
                (transport, person, now),
            )

    async def link_failures(self, *, since: float) -> tuple[int, dict[tuple[str, str], int]]:
        """Failed redemptions since ``since``: in all, and per (transport, person)."""
        rows = await self._all(
            "SELECT transport, person, count(*) FROM link_failures WHERE at >= ? "
            "GROUP BY transport, person",
            (since,),
        )
        per = {(str(r[0]), str(r[1])): int(r[2]) for r in rows}
        return sum(per.values()), per


async def give_back(db: aiosqlite.Connection, other_id: int) -> int:
    """Move the rows that came from ``other_id`` back to it (inside the caller's transaction)."""
    cur = await db.execute("SELECT merged_into FROM conversations WHERE id = ?", (other_id,))
    row = await cur.fetchone()
    home_id = row[0] if row else None
    moved = 0
    for table in _MOVED:
        cur = await db.execute(
            f"UPDATE {table} SET conversation_id = ?, origin_conversation_id = NULL "
            "WHERE origin_conversation_id = ?",
            (other_id, other_id),
        )
        if table == "messages":
            moved = cur.rowcount
    await db.execute(
        "UPDATE message_vectors SET conversation_id = ? WHERE message_id IN "
        "(SELECT id FROM messages WHERE conversation_id = ?)",
        (other_id, other_id),
    )
    await db.execute("UPDATE conversations SET merged_into = NULL WHERE id = ?", (other_id,))
    if home_id is not None:
        await db.execute("DELETE FROM longterm_summaries WHERE conversation_id = ?", (home_id,))
    return moved
