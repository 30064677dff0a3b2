"""Linked identities and incognito, per conversation (both backends).

Invariants:
- Only DM conversations link; a conversation is either a home, absorbed into one home
  (``merged_into``), or alone. Absorbed conversations keep their row (their key) and no rows.
- Linking moves the absorbed DM's messages, vectors, facts and sessions into the home and
  records ``origin_conversation_id`` on each; unlinking moves exactly those rows back (new
  messages that arrived through the absorbed side carry it too), so each side keeps its own.
  Search words follow the rows: SQLite's FTS update trigger re-keys them, PostgreSQL re-keys
  them in the same UPDATE (``Dialect.rekey_search``).
- Both conversation rows are read with ``Dialect.for_update`` for the move, so on PostgreSQL a
  link from another gateway at the same time waits and then sees the first one's result
  (SQLite's ``BEGIN IMMEDIATE`` already serialises writers).
- Incognito is a flag on the conversation (a linked DM uses its home's) plus the id of the
  running stretch (``incognito_stretch``): ``set_incognito`` and ``end_incognito`` give a new
  id (or none when off), so a gateway holding a stretch's turns in memory sees that it ended
  (``bot.memory.stretch``).
- Linking keeps "each message is read for facts once": the home's ``facts_through`` becomes
  the later of the two marks and the messages of either side between its own mark and that
  one are flagged ``facts_pending`` (read at the next extraction, then cleared).
- Unlinking drops the recall notes that quote a message now in the other conversation.
- Key pins (``key_pins``): one public key per (transport, person); ``pin_key`` never replaces
  one unless told to (the operator's re-pin), so of two gateways pinning at once the first
  wins and both read the same key back.
- Rolling summaries stay where they were written. Linking keeps the home's long-term summary
  (or copies the other side's when the home has none); unlinking drops the home's (it mixed
  both sides) and it is rebuilt at the next session close.
"""

from __future__ import annotations

import base64
import secrets
import time

from bot.domain import DM_SPACE, ConversationKey
from bot.errors import MemoryRefused
from bot.memory.core.db import CoreBase, Dialect, Tx
from bot.memory.core.notes import drop_stale_notes
from bot.memory.records import KeyPin

_MOVED = ("messages", "facts", "sessions")


def new_stretch() -> str:
    """A fresh incognito stretch id (random: never equal to an ended one, even after a
    ``!forget`` freed the conversation's id for reuse)."""
    return secrets.token_hex(8)


class LinkError(MemoryRefused):
    """A link that cannot be made; the message says why and what to do."""


class IdentityMixin(CoreBase):
    async def link_dm(
        self, home: ConversationKey, other: ConversationKey, *, done: int | None = None
    ) -> int:
        """Join ``other``'s DM memory into ``home``'s; returns the number of messages moved."""
        if home.space != DM_SPACE or other.space != DM_SPACE:
            raise LinkError("only direct messages can be linked; channel spaces never merge.")
        if home.transport == other.transport:
            raise LinkError("send the code from your account on the other transport.")
        d = self.dialect
        async with self._atomic() as tx:
            ids: list[int] = []
            marks: list[int] = []
            for key in (home, other):
                await tx.exec(
                    "INSERT INTO conversations (transport, person, space, created_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (key.transport, key.person, key.space, time.time()),
                )
                row = await tx.one(
                    "SELECT id, merged_into, facts_through FROM conversations "
                    "WHERE transport = ? AND person = ? AND space = ?" + d.for_update,
                    (key.transport, key.person, key.space),
                )
                assert row is not None
                homes = await tx.val(
                    "SELECT count(*) FROM conversations WHERE merged_into = ?", (row[0],)
                )
                if row[1] is not None or homes:
                    raise LinkError(
                        "one of these accounts is already linked; send !unlink there first."
                    )
                ids.append(int(row[0]))
                marks.append(int(row[2] or 0))
            home_id, other_id = ids
            # Facts: each side read its messages up to its own mark. The home keeps the later
            # mark; what either side had not read below it is flagged, so it is read once.
            mark = max(marks)
            for conv_id, own in zip(ids, marks, strict=True):
                await tx.exec(
                    "UPDATE messages SET facts_pending = 1 WHERE conversation_id = ? "
                    "AND id > ? AND id <= ?",
                    (conv_id, own, mark),
                )
            await tx.exec(
                "UPDATE conversations SET facts_through = ? WHERE id = ?", (mark, home_id)
            )
            moved = await tx.exec(
                "UPDATE messages SET conversation_id = ?, origin_conversation_id = ?"
                f"{d.rekey_search} WHERE conversation_id = ?",
                (home_id, other_id, *((home_id,) if d.rekey_search else ()), other_id),
            )
            for table in ("facts", "sessions"):
                await tx.exec(
                    f"UPDATE {table} SET conversation_id = ?, origin_conversation_id = ? "
                    "WHERE conversation_id = ?",
                    (home_id, other_id, other_id),
                )
            await tx.exec(
                "UPDATE message_vectors SET conversation_id = ? WHERE conversation_id = ?",
                (home_id, other_id),
            )
            await tx.exec(
                "UPDATE conversations SET merged_into = ? WHERE id = ?", (home_id, other_id)
            )
            # The long-term summary stays (the person's story so far); a home without one
            # starts from a copy of the other side's (which keeps its own for !unlink).
            await tx.exec(
                "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions, "
                "up_to_message_id, updated_at) SELECT ?, text, tokens, sessions, "
                "up_to_message_id, updated_at FROM longterm_summaries WHERE conversation_id = ? "
                "AND NOT EXISTS (SELECT 1 FROM longterm_summaries WHERE conversation_id = ?) "
                "ORDER BY up_to_message_id DESC, id DESC LIMIT 1",
                (home_id, other_id, home_id),
            )
            await self._command_done(tx, done)
        self._vectors.drop([home_id, other_id])
        return moved

    async def unlink_dm(self, key: ConversationKey, *, done: int | None = None) -> int | None:
        """Separate the link ``key`` belongs to (from either side); returns the number of
        messages given back, or None when ``key`` is not linked."""
        d = self.dialect
        async with self._atomic() as tx:
            row = await tx.one(
                "SELECT id, merged_into FROM conversations "
                "WHERE transport = ? AND person = ? AND space = ?" + d.for_update,
                (key.transport, key.person, key.space),
            )
            if row is None:
                return None
            if row[1] is not None:
                absorbed = [int(row[0])]
            else:
                rows = await tx.all(
                    "SELECT id FROM conversations WHERE merged_into = ?" + d.for_update,
                    (row[0],),
                )
                absorbed = [int(r[0]) for r in rows]
            if not absorbed:
                return None
            moved = 0
            for other_id in absorbed:
                moved += await give_back(tx, d, other_id)
            await drop_stale_notes(tx, d, [int(row[0]), *absorbed, *([row[1]] if row[1] else [])])
            await self._command_done(tx, done)
        self._vectors.clear()
        return moved

    async def set_incognito(self, conversation_id: int, on: bool) -> None:
        """Turn incognito on (a new stretch, with a new id, even when it was on) or off."""
        await self._exec(
            "UPDATE conversations SET incognito = ?, incognito_stretch = ? WHERE id = ?",
            (int(on), new_stretch() if on else None, conversation_id),
        )

    async def is_incognito(self, conversation_id: int) -> bool:
        value = await self._val(
            "SELECT incognito FROM conversations WHERE id = ?", (conversation_id,)
        )
        return bool(value)

    async def incognito_stretch(self, conversation_id: int) -> str | None:
        """The id of the conversation's incognito stretch, None when incognito is off (a
        stretch begun before stretches had ids, or imported, is ``""``)."""
        row = await self._one(
            "SELECT incognito, incognito_stretch FROM conversations WHERE id = ?",
            (conversation_id,),
        )
        if row is None or not row[0]:
            return None
        return str(row[1] or "")

    async def end_incognito(self, transport: str, person: str, *, space: str | None) -> int:
        """End the incognito stretches of the person's conversations (in ``space``, or in every
        space when None) and of the conversations linked with them: one still incognito gets
        a new stretch id, one not incognito none. Returns the rows changed."""
        who = "transport = ? AND person = ?" + ("" if space is None else " AND space = ?")
        args = (transport, person, *(() if space is None else (space,)))
        homes = f"SELECT coalesce(merged_into, id) FROM conversations WHERE {who}"
        return await self._exec(
            "UPDATE conversations SET incognito_stretch = "
            "CASE WHEN incognito != 0 THEN ? ELSE NULL END "
            f"WHERE id IN ({homes}) OR merged_into IN ({homes})",
            (new_stretch(), *args, *args),
        )

    # --- link codes (bot.memory.links decides; this is the SQL) ------------------------------
    async def save_link_code(
        self, code_hash: str, transport: str, person: str, *, expires_at: float, now: float
    ) -> bool:
        """Store a new code for the person (replacing theirs; expired ones go); False if the
        hash is taken by a live code (the caller draws another)."""
        async with self._atomic() as tx:
            await tx.exec(
                "DELETE FROM link_codes WHERE expires_at <= ? OR (transport = ? AND person = ?)",
                (now, transport, person),
            )
            added = await tx.exec(
                "INSERT INTO link_codes (code_hash, transport, person, expires_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (code_hash, transport, person, expires_at),
            )
            return added == 1

    async def take_link_code(
        self, code_hash: str, *, transport: str, now: float
    ) -> tuple[str, str] | None:
        """Spend a live code issued on another transport: (transport, person) or None. Two
        gateways redeeming it at once: the row lock lets one delete it, the other finds none."""
        async with self._atomic() as tx:
            row = await tx.one(
                "DELETE FROM link_codes WHERE code_hash = ? AND expires_at > ? AND transport != ? "
                "RETURNING transport, person",
                (code_hash, now, transport),
            )
            return None if row is None else (str(row[0]), str(row[1]))

    async def note_link_failure(self, transport: str, person: str, *, now: float) -> None:
        async with self._atomic() as tx:
            await tx.exec("DELETE FROM link_failures WHERE at < ?", (now - 86_400,))
            await tx.exec(
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

    # --- key pins (bot.transports.mesh_keys decides; this is the SQL) -------------------------
    async def key_pin(self, transport: str, person: str) -> KeyPin | None:
        row = await self._one(
            "SELECT transport, person, public_key, pinned_at FROM key_pins "
            "WHERE transport = ? AND person = ?",
            (transport, person),
        )
        return None if row is None else _pin(row)

    async def pin_key(
        self,
        transport: str,
        person: str,
        key: bytes,
        *,
        replace: bool = False,
        pinned_at: float | None = None,
    ) -> bytes:
        """Pin ``key`` for the person unless one is pinned (``replace``: the operator's
        re-pin; ``pinned_at``: an import's date); returns the key pinned now."""
        async with self._atomic() as tx:
            if replace:
                await tx.exec(
                    "DELETE FROM key_pins WHERE transport = ? AND person = ?", (transport, person)
                )
            await tx.exec(
                "INSERT INTO key_pins (transport, person, public_key, pinned_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    transport,
                    person,
                    base64.b64encode(key).decode("ascii"),
                    pinned_at or time.time(),
                ),
            )
            held = await tx.val(
                "SELECT public_key FROM key_pins WHERE transport = ? AND person = ?",
                (transport, person),
            )
        return base64.b64decode(str(held))

    async def unpin_key(self, transport: str, person: str) -> bool:
        async with self._atomic() as tx:
            n = await tx.exec(
                "DELETE FROM key_pins WHERE transport = ? AND person = ?", (transport, person)
            )
        return bool(n)

    async def key_pins(self) -> list[KeyPin]:
        rows = await self._all(
            "SELECT transport, person, public_key, pinned_at FROM key_pins "
            "ORDER BY transport, person"
        )
        return [_pin(r) for r in rows]


def _pin(row: tuple[object, ...]) -> KeyPin:
    return KeyPin(str(row[0]), str(row[1]), base64.b64decode(str(row[2])), float(str(row[3])))


async def give_back(tx: Tx, d: Dialect, other_id: int) -> int:
    """Move the rows that came from ``other_id`` back to it (inside the caller's transaction)."""
    home_id = await tx.val("SELECT merged_into FROM conversations WHERE id = ?", (other_id,))
    moved = 0
    for table in _MOVED:
        rekey = d.rekey_search if table == "messages" else ""
        n = await tx.exec(
            f"UPDATE {table} SET conversation_id = ?, origin_conversation_id = NULL{rekey} "
            "WHERE origin_conversation_id = ?",
            (other_id, *((other_id,) if rekey else ()), other_id),
        )
        if table == "messages":
            moved = n
    await tx.exec(
        "UPDATE message_vectors SET conversation_id = ? WHERE message_id IN "
        "(SELECT id FROM messages WHERE conversation_id = ?)",
        (other_id, other_id),
    )
    await tx.exec("UPDATE conversations SET merged_into = NULL WHERE id = ?", (other_id,))
    if home_id is not None:
        await tx.exec("DELETE FROM longterm_summaries WHERE conversation_id = ?", (home_id,))
    return moved
