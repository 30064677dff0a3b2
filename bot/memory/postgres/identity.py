"""Linked identities and incognito on PostgreSQL, per conversation.

Invariants (as ``bot.memory.sqlite.identity``):
- Only DM conversations link; a conversation is either a home, absorbed into one home
  (``merged_into``), or alone. Absorbed conversations keep their row and no rows.
- Linking moves the absorbed DM's messages (their search words re-keyed to the new
  conversation, ``meshsage_keyed``), vectors,
  facts and sessions into the home, recording ``origin_conversation_id``; unlinking moves
  exactly those rows back. Both conversation rows are locked for the move, so a link from
  another gateway at the same time waits and then sees the first one's result.
"""

from __future__ import annotations

import time

from bot.domain import DM_SPACE, ConversationKey
from bot.errors import MemoryRefused
from bot.memory.postgres.base import Conn, PgBase

_MOVED = ("messages", "facts", "sessions")


class LinkError(MemoryRefused):
    """A link that cannot be made; the message says why and what to do."""


class IdentityMixin(PgBase):
    async def link_dm(self, home: ConversationKey, other: ConversationKey) -> int:
        """Join ``other``'s DM memory into ``home``'s; returns the number of messages moved."""
        if home.space != DM_SPACE or other.space != DM_SPACE:
            raise LinkError("only direct messages can be linked; channel spaces never merge.")
        if home.transport == other.transport:
            raise LinkError("send the code from your account on the other transport.")
        async with self._tx() as con:
            ids = []
            for key in (home, other):
                await con.execute(
                    "INSERT INTO conversations (transport, person, space, created_at) "
                    "VALUES ($1, $2, $3, $4) ON CONFLICT (transport, person, space) DO NOTHING",
                    key.transport,
                    key.person,
                    key.space,
                    time.time(),
                )
                row = await con.fetchrow(
                    "SELECT id, merged_into FROM conversations "
                    "WHERE transport = $1 AND person = $2 AND space = $3 FOR UPDATE",
                    key.transport,
                    key.person,
                    key.space,
                )
                assert row is not None
                homes = await con.fetchval(
                    "SELECT count(*) FROM conversations WHERE merged_into = $1", row[0]
                )
                if row[1] is not None or homes:
                    raise LinkError(
                        "one of these accounts is already linked; send !unlink there first."
                    )
                ids.append(int(row[0]))
            home_id, other_id = ids
            moved = await con.fetchval(
                "WITH moved AS (UPDATE messages SET conversation_id = $1, "
                "origin_conversation_id = $2, search = meshsage_keyed($1, search) "
                "WHERE conversation_id = $2 RETURNING 1) "
                "SELECT count(*) FROM moved",
                home_id,
                other_id,
            )
            for table in ("facts", "sessions"):
                await con.execute(
                    f"UPDATE {table} SET conversation_id = $1, origin_conversation_id = $2 "
                    "WHERE conversation_id = $2",
                    home_id,
                    other_id,
                )
            await con.execute(
                "UPDATE message_vectors SET conversation_id = $1 WHERE conversation_id = $2",
                home_id,
                other_id,
            )
            await con.execute(
                "UPDATE conversations SET merged_into = $1 WHERE id = $2", home_id, other_id
            )
            # The long-term summary stays (the person's story so far); a home without one
            # starts from a copy of the other side's (which keeps its own for !unlink).
            await con.execute(
                "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions, "
                "up_to_message_id, updated_at) SELECT $1, text, tokens, sessions, "
                "up_to_message_id, updated_at FROM longterm_summaries WHERE conversation_id = $2 "
                "AND NOT EXISTS (SELECT 1 FROM longterm_summaries WHERE conversation_id = $1) "
                "ORDER BY up_to_message_id DESC, id DESC LIMIT 1",
                home_id,
                other_id,
            )
        self._vectors.drop([home_id, other_id])
        return int(moved)

    async def unlink_dm(self, key: ConversationKey) -> int | None:
        """Separate the link ``key`` belongs to (from either side); returns the number of
        messages given back, or None when ``key`` is not linked."""
        async with self._tx() as con:
            row = await con.fetchrow(
                "SELECT id, merged_into FROM conversations "
                "WHERE transport = $1 AND person = $2 AND space = $3 FOR UPDATE",
                key.transport,
                key.person,
                key.space,
            )
            if row is None:
                return None
            if row[1] is not None:
                absorbed = [int(row[0])]
            else:
                absorbed = [
                    int(r[0])
                    for r in await con.fetch(
                        "SELECT id FROM conversations WHERE merged_into = $1 FOR UPDATE", row[0]
                    )
                ]
            if not absorbed:
                return None
            moved = 0
            for other_id in absorbed:
                moved += await give_back(con, other_id)
        self._vectors.clear()
        return moved

    async def set_incognito(self, conversation_id: int, on: bool) -> None:
        await self._val(
            "UPDATE conversations SET incognito = $1 WHERE id = $2", (int(on), conversation_id)
        )

    async def is_incognito(self, conversation_id: int) -> bool:
        value = await self._val(
            "SELECT incognito FROM conversations WHERE id = $1", (conversation_id,)
        )
        return bool(value)

    # --- link codes (bot.memory.links decides; this is the SQL) ------------------------------
    async def save_link_code(
        self, code_hash: str, transport: str, person: str, *, expires_at: float, now: float
    ) -> bool:
        """Store a new code for the person (replacing theirs; expired ones go); False if the
        hash is taken by a live code (the caller draws another)."""
        async with self._tx() as con:
            await con.execute(
                "DELETE FROM link_codes WHERE expires_at <= $1 OR (transport = $2 AND person = $3)",
                now,
                transport,
                person,
            )
            taken = await con.fetchval(
                "INSERT INTO link_codes (code_hash, transport, person, expires_at) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1",
                code_hash,
                transport,
                person,
                expires_at,
            )
            return taken is not None

    async def take_link_code(
        self, code_hash: str, *, transport: str, now: float
    ) -> tuple[str, str] | None:
        """Spend a live code issued on another transport: (transport, person) or None. Two
        gateways redeeming it at once: the row lock lets one delete it, the other finds none."""
        async with self._tx() as con:
            row = await con.fetchrow(
                "DELETE FROM link_codes WHERE code_hash = $1 AND expires_at > $2 "
                "AND transport != $3 RETURNING transport, person",
                code_hash,
                now,
                transport,
            )
            return None if row is None else (str(row[0]), str(row[1]))

    async def note_link_failure(self, transport: str, person: str, *, now: float) -> None:
        async with self._tx() as con:
            await con.execute("DELETE FROM link_failures WHERE at < $1", now - 86_400)
            await con.execute(
                "INSERT INTO link_failures (transport, person, at) VALUES ($1, $2, $3)",
                transport,
                person,
                now,
            )

    async def link_failures(self, *, since: float) -> tuple[int, dict[tuple[str, str], int]]:
        """Failed redemptions since ``since``: in all, and per (transport, person)."""
        rows = await self._all(
            "SELECT transport, person, count(*) FROM link_failures WHERE at >= $1 "
            "GROUP BY transport, person",
            (since,),
        )
        per = {(str(r[0]), str(r[1])): int(r[2]) for r in rows}
        return sum(per.values()), per


async def give_back(con: Conn, other_id: int) -> int:
    """Move the rows that came from ``other_id`` back to it (inside the caller's transaction)."""
    home_id = await con.fetchval("SELECT merged_into FROM conversations WHERE id = $1", other_id)
    moved = 0
    for table in _MOVED:
        rekey = ", search = meshsage_keyed($1, search)" if table == "messages" else ""
        n = await con.fetchval(
            f"WITH back AS (UPDATE {table} SET conversation_id = $1, "
            f"origin_conversation_id = NULL{rekey} WHERE origin_conversation_id = $1 "
            "RETURNING 1) SELECT count(*) FROM back",
            other_id,
        )
        if table == "messages":
            moved = int(n)
    await con.execute(
        "UPDATE message_vectors SET conversation_id = $1 WHERE message_id IN "
        "(SELECT id FROM messages WHERE conversation_id = $1)",
        other_id,
    )
    await con.execute("UPDATE conversations SET merged_into = NULL WHERE id = $1", other_id)
    if home_id is not None:
        await con.execute("DELETE FROM longterm_summaries WHERE conversation_id = $1", home_id)
    return moved
