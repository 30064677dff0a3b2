"""Recall notes and the messages they quote (both backends).

A recall note (``messages.recall_note``, bot.memory.context) repeats older turns that retrieval
found for a person's message; ``messages.recall_ids`` lists the ids of the messages it quotes
(a JSON list; NULL on a note saved before the ids were kept).

Invariants:
- A note never outlives a message it quotes in its conversation: every path that takes
  messages out of a conversation (retention, forgetting by use, ``!forget`` on a link's other
  side, ``!unlink``) calls ``drop_stale_notes`` in the same transaction, which clears each note
  of those conversations that quotes a message no longer there, and each note whose sources
  are unknown (saved before the ids were kept: it may quote anything older).
- Reading checks it again: ``recall_notes`` never returns a note quoting a message gone from
  its conversation, whatever path removed it (a second line of defence, for the prompt).
- A dropped note is gone from the prompt too (its turn shows without it): the prompt changes
  once there, never shows text that was deleted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from bot.memory.core.db import Dialect, Tx


def quoted_json(note: str, quoted: Sequence[int]) -> str | None:
    """What ``recall_ids`` holds for a note quoting ``quoted`` (NULL without a note)."""
    return json.dumps(sorted({int(i) for i in quoted})) if note else None


def quotes_missing(d: Dialect) -> str:
    """SQL true when the note of the ``messages`` row quotes a message that is no longer in
    its conversation."""
    each = d.json_ids.format(col="messages.recall_ids", alias="j")
    return (
        f"EXISTS (SELECT 1 FROM {each} WHERE NOT EXISTS (SELECT 1 FROM messages q "
        "WHERE q.id = CAST(j.value AS BIGINT) AND q.conversation_id = messages.conversation_id))"
    )


async def drop_stale_notes(tx: Tx, d: Dialect, conversation_ids: Sequence[int]) -> int:
    """Clear the notes of these conversations that quote a message no longer in the
    conversation (or whose sources are unknown); the number of notes cleared."""
    ids = sorted(set(conversation_ids))
    if not ids:
        return 0
    where, params = d.in_ids("messages.conversation_id", ids)
    return await tx.exec(
        "UPDATE messages SET recall_note = NULL, recall_ids = NULL "
        f"WHERE {where} AND recall_note IS NOT NULL "
        f"AND (recall_ids IS NULL OR {quotes_missing(d)})",
        params,
    )
