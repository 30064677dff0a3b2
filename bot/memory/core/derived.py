"""Summaries and facts: derived from the raw log, each recording what it covers (both backends).

Invariants:
- A summary computed before a ``!reset`` is refused at save time, inside the same transaction
  (on PostgreSQL the conversation row is locked, so a concurrent reset from another gateway
  waits or wins; SQLite's ``BEGIN IMMEDIATE`` already serialises writers).
- Summaries are chapters: saving one deletes only the rows whose message range it covers, so
  folds append chapters and a merge (one row over their union) replaces them.
- Pinned facts (``!remember``) are never changed by ``update_fact`` or an ``extracted_only``
  removal; ``source_ids`` is a JSON list of the message ids a fact came from. A replaced
  value is kept in the row's ``history`` (JSON, the last ``FACT_HISTORY``), so it goes with
  the row: ``!unremember`` and ``!forget`` take a fact's history with it.
- ``facts_through`` only moves forward; moving it past a message flagged ``facts_pending`` (one
  a ``!link`` brought in below the mark unread) clears the flag in the same statement batch:
  a message is read for facts once, whichever way it came.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from bot.memory.core.db import CoreBase
from bot.memory.records import (
    MSG_COLS,
    Conversation,
    Fact,
    FactChange,
    StoredMessage,
    Summary,
    msg_from_row,
)

FACT_HISTORY = 5  # earlier values kept per fact


class DerivedMixin(CoreBase):
    # --- summaries --------------------------------------------------------------------------
    async def latest_summary(self, conversation: Conversation) -> Summary | None:
        """The newest chapter (the one reaching furthest into the log)."""
        row = await self._one(
            "SELECT id, text, first_message_id, last_message_id, tokens, created_at "
            "FROM summaries WHERE conversation_id = ? AND first_message_id > ? "
            "ORDER BY last_message_id DESC, id DESC LIMIT 1",
            (conversation.id, conversation.reset_after),
        )
        return None if row is None else Summary(*row)

    async def summaries(self, conversation: Conversation) -> list[Summary]:
        """Summary chapters after the reset mark, oldest first."""
        rows = await self._all(
            "SELECT id, text, first_message_id, last_message_id, tokens, created_at "
            "FROM summaries WHERE conversation_id = ? AND first_message_id > ? "
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
        async with self._atomic(durable=False) as tx:  # derived: computed again if lost
            mark = await tx.val(
                "SELECT reset_after FROM conversations WHERE id = ?" + self.dialect.for_update,
                (conversation_id,),
            )
            if mark is None or first_message_id <= mark:
                return False
            new_id = await tx.val(
                "INSERT INTO summaries (conversation_id, text, first_message_id, "
                "last_message_id, tokens, created_at) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (conversation_id, text, first_message_id, last_message_id, tokens, time.time()),
            )
            # Chapters this one covers are superseded (a merge); earlier chapters stay.
            await tx.exec(
                "DELETE FROM summaries WHERE conversation_id = ? AND id < ? "
                "AND first_message_id >= ? AND last_message_id <= ?",
                (conversation_id, new_id, first_message_id, last_message_id),
            )
            return True

    # --- facts ------------------------------------------------------------------------------
    async def facts(self, conversation_id: int) -> list[Fact]:
        rows = await self._all(
            "SELECT id, text, tokens, created_at, pinned, source_ids, updated_at, history "
            "FROM facts WHERE conversation_id = ? ORDER BY id",
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
        done: int | None = None,
    ) -> int:
        now = time.time() if created_at is None else created_at
        sql = (
            "INSERT INTO facts (conversation_id, text, tokens, created_at, pinned, source_ids,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id"
        )
        args = (conversation_id, text, tokens, now, int(pinned), _ids(source_ids), now)
        if done is None:
            return int(await self._val(sql, args))
        async with self._atomic() as tx:  # a held command's effect: marked done with it
            value = await tx.val(sql, args)
            await self._command_done(tx, done)
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
        """Rewrite an extracted fact (never a pinned one); provenance accumulates, and a
        changed text keeps the old one in the fact's history."""
        now = time.time() if updated_at is None else updated_at
        async with self._atomic(durable=False) as tx:  # extracted: read again if lost
            old = await tx.one(
                "SELECT source_ids, text, history FROM facts WHERE conversation_id = ? "
                "AND id = ? AND pinned = 0" + self.dialect.for_update,
                (conversation_id, fact_id),
            )
            if old is None:
                return False
            merged = sorted({*json.loads(old[0]), *source_ids})
            history = old[2] if old[1] == text else _pushed(old[2], old[1], now, False, old[0])
            await tx.exec(
                "UPDATE facts SET text = ?, tokens = ?, source_ids = ?, updated_at = ?, "
                "history = ? WHERE id = ?",
                (text, tokens, _ids(merged), now, history, fact_id),
            )
            return True

    async def revise_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        text: str,
        tokens: int,
        pinned: bool,
        source_ids: Sequence[int],
        updated_at: float | None = None,
        done: int | None = None,
    ) -> Fact | None:
        """Give a fact a new value (pinned or not): the old text, whose it was and its sources
        go to the history; the sources become ``source_ids``. Returns the fact as it was (None
        when it is gone)."""
        now = time.time() if updated_at is None else updated_at
        async with self._atomic() as tx:  # the person's own words (!remember): durable
            row = await tx.one(
                "SELECT id, text, tokens, created_at, pinned, source_ids, updated_at, history "
                "FROM facts WHERE conversation_id = ? AND id = ?" + self.dialect.for_update,
                (conversation_id, fact_id),
            )
            if row is None:
                return None
            history = _pushed(row[7], row[1], now, bool(row[4]), row[5])
            await tx.exec(
                "UPDATE facts SET text = ?, tokens = ?, pinned = ?, source_ids = ?, "
                "updated_at = ?, history = ? WHERE id = ?",
                (text, tokens, int(pinned), _ids(source_ids), now, history, fact_id),
            )
            await self._command_done(tx, done)
            return _fact(row)

    async def remove_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        extracted_only: bool = False,
        done: int | None = None,
    ) -> bool:
        sql = "DELETE FROM facts WHERE conversation_id = ? AND id = ? AND (? = 0 OR pinned = 0)"
        args = (conversation_id, fact_id, int(extracted_only))
        if done is None:
            return await self._exec(sql, args) > 0
        async with self._atomic() as tx:  # a held command's effect: marked done with it
            removed = await tx.exec(sql, args)
            await self._command_done(tx, done)
        return removed > 0

    async def facts_through(self, conversation_id: int) -> int:
        """The high-water mark of fact extraction: every message of the conversation up to
        this id has been read for facts (``bot.memory.facts``)."""
        value = await self._val(
            "SELECT facts_through FROM conversations WHERE id = ?", (conversation_id,)
        )
        return int(value or 0)

    async def set_facts_through(self, conversation_id: int, message_id: int) -> None:
        """Move the mark forward to ``message_id`` (never back: a slower reader of an earlier
        range cannot undo a later one); the flagged messages up to it count as read."""
        async with self._atomic(durable=False) as tx:  # lost with the server: read again
            await tx.exec(
                "UPDATE conversations SET facts_through = ? WHERE id = ? AND facts_through < ?",
                (message_id, conversation_id, message_id),
            )
            await tx.exec(
                "UPDATE messages SET facts_pending = 0 WHERE conversation_id = ? "
                "AND facts_pending = 1 AND id <= ?",
                (conversation_id, message_id),
            )

    async def facts_pending(self, conversation_id: int) -> list[StoredMessage]:
        """Messages below the mark not read for facts yet (a ``!link`` moved them in), oldest
        first."""
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = ? AND facts_pending = 1 "
            "ORDER BY id",
            (conversation_id,),
        )
        return [msg_from_row(r) for r in rows]


def _ids(ids: Sequence[int]) -> str:
    return json.dumps([int(i) for i in ids], separators=(",", ":"))


def _fact(row: Sequence[Any]) -> Fact:
    return Fact(
        id=row[0],
        text=row[1],
        tokens=row[2],
        created_at=row[3],
        pinned=bool(row[4]),
        source_ids=tuple(json.loads(row[5])),
        updated_at=row[6],
        history=_history(row[7]),
    )


def _history(raw: str | None) -> tuple[FactChange, ...]:
    try:
        items = json.loads(raw or "[]")
    except ValueError:
        return ()
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            sources = item.get("source_ids")
            out.append(
                FactChange(
                    text=item["text"],
                    until=float(item.get("until") or 0.0),
                    pinned=bool(item.get("pinned")),
                    source_ids=tuple(
                        i
                        for i in (sources if isinstance(sources, list) else [])
                        if isinstance(i, int)
                    ),
                )
            )
    return tuple(out)


def _pushed(raw: str | None, text: str, until: float, pinned: bool, sources: str) -> str:
    """``raw`` history with one more entry, the oldest dropped past ``FACT_HISTORY``."""
    try:
        items = json.loads(raw or "[]")
    except ValueError:
        items = []
    entry = {"text": text, "until": until, "pinned": pinned, "source_ids": json.loads(sources)}
    kept = [*(items if isinstance(items, list) else []), entry][-FACT_HISTORY:]
    return json.dumps(kept, separators=(",", ":"))
