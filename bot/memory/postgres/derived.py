"""Summaries and facts on PostgreSQL: derived from the raw log, each recording what it covers.

Invariants:
- Summaries are chapters: saving one deletes only the rows whose message range it covers.
- A summary computed before a ``!reset`` is refused at save time, inside the same transaction
  (the conversation row is locked, so a concurrent reset from another gateway waits or wins).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from bot.memory.postgres.base import PgBase
from bot.memory.records import Conversation, Fact, Summary


class DerivedMixin(PgBase):
    # --- summaries --------------------------------------------------------------------------
    async def latest_summary(self, conversation: Conversation) -> Summary | None:
        """The newest chapter (the one reaching furthest into the log)."""
        row = await self._one(
            "SELECT id, text, first_message_id, last_message_id, tokens, created_at "
            "FROM summaries WHERE conversation_id = $1 AND first_message_id > $2 "
            "ORDER BY last_message_id DESC, id DESC LIMIT 1",
            (conversation.id, conversation.reset_after),
        )
        return None if row is None else Summary(*row)

    async def summaries(self, conversation: Conversation) -> list[Summary]:
        """Summary chapters after the reset mark, oldest first."""
        rows = await self._all(
            "SELECT id, text, first_message_id, last_message_id, tokens, created_at "
            "FROM summaries WHERE conversation_id = $1 AND first_message_id > $2 "
            "ORDER BY first_message_id, id",
            (conversation.id, conversation.reset_after),
        )
        return [Summary(*r) for r in rows]

    async def save_summary(
        self,
        conversation_id: int,
        *,
        text: str,
        first_message_id: int,
        last_message_id: int,
        tokens: int,
    ) -> bool:
        """Store a summary unless a reset happened after ``first_message_id`` was chosen."""
        async with self._tx() as con:
            mark = await con.fetchval(
                "SELECT reset_after FROM conversations WHERE id = $1 FOR UPDATE", conversation_id
            )
            if mark is None or first_message_id <= mark:
                return False
            new_id = await con.fetchval(
                "INSERT INTO summaries (conversation_id, text, first_message_id, "
                "last_message_id, tokens, created_at) VALUES ($1, $2, $3, $4, $5, $6) "
                "RETURNING id",
                conversation_id,
                text,
                first_message_id,
                last_message_id,
                tokens,
                time.time(),
            )
            # Chapters this one covers are superseded (a merge); earlier chapters stay.
            await con.execute(
                "DELETE FROM summaries WHERE conversation_id = $1 AND id < $2 "
                "AND first_message_id >= $3 AND last_message_id <= $4",
                conversation_id,
                new_id,
                first_message_id,
                last_message_id,
            )
            return True

    # --- facts ------------------------------------------------------------------------------
    async def facts(self, conversation_id: int) -> list[Fact]:
        rows = await self._all(
            "SELECT id, text, tokens, created_at, pinned, source_ids, updated_at FROM facts "
            "WHERE conversation_id = $1 ORDER BY id",
            (conversation_id,),
        )
        return [_fact(r) for r in rows]

    async def add_fact(
        self,
        conversation_id: int,
        *,
        text: str,
        tokens: int,
        pinned: bool = True,
        source_ids: Sequence[int] = (),
        created_at: float | None = None,
    ) -> int:
        now = time.time() if created_at is None else created_at
        value = await self._val(
            "INSERT INTO facts (conversation_id, text, tokens, created_at, pinned, source_ids,"
            " updated_at) VALUES ($1, $2, $3, $4, $5, $6, $4) RETURNING id",
            (conversation_id, text, tokens, now, int(pinned), _ids(source_ids)),
        )
        return int(value)

    async def update_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        text: str,
        tokens: int,
        source_ids: Sequence[int],
        updated_at: float | None = None,
    ) -> bool:
        """Rewrite an extracted fact (never a pinned one); provenance accumulates."""
        now = time.time() if updated_at is None else updated_at
        async with self._tx() as con:
            old = await con.fetchval(
                "SELECT source_ids FROM facts WHERE conversation_id = $1 AND id = $2 "
                "AND pinned = 0 FOR UPDATE",
                conversation_id,
                fact_id,
            )
            if old is None:
                return False
            merged = sorted({*json.loads(old), *source_ids})
            await con.execute(
                "UPDATE facts SET text = $1, tokens = $2, source_ids = $3, updated_at = $4 "
                "WHERE id = $5",
                text,
                tokens,
                _ids(merged),
                now,
                fact_id,
            )
            return True

    async def remove_fact(
        self, conversation_id: int, fact_id: int, *, extracted_only: bool = False
    ) -> bool:
        value = await self._val(
            "DELETE FROM facts WHERE conversation_id = $1 AND id = $2 "
            "AND (NOT $3 OR pinned = 0) RETURNING id",
            (conversation_id, fact_id, extracted_only),
        )
        return value is not None


def _ids(ids: Sequence[int]) -> str:
    return json.dumps([int(i) for i in ids], separators=(",", ":"))


def _fact(row: Any) -> Fact:
    return Fact(
        id=row[0],
        text=row[1],
        tokens=row[2],
        created_at=row[3],
        pinned=bool(row[4]),
        source_ids=tuple(json.loads(row[5])),
        updated_at=row[6],
    )
