"""The recall port: what retrieval reads and writes besides the log, the term index, the
outline, vectors, use counts and recall notes (``bot.memory.core.search`` and each backend's
``search`` module, ``bot.memory.core.upkeep``).

Invariants every implementation keeps:
- ``search_terms``, ``outline`` and ``vector_search`` are scoped to one conversation and never
  read other people's rows; callers pass the reset mark (``after_id``), so nothing at or below
  it is found. ``vector_search`` scores with the cosine similarity, best first.
- ``add_vectors`` skips messages that no longer exist; a message keeps one vector (the newest
  model's), and ``messages_missing_vectors`` lists what a model has not embedded yet.
- A recall note records the messages it quotes (``save_recall_note(quoted=...)``); no
  deletion or unlink leaves a note quoting a message gone from its conversation.
- ``note_retrieved`` counts a use of each message retrieval put into a prompt (what
  ``prune_by_use`` keeps longest).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bot.memory.records import StoredMessage


class Recall(Protocol):
    """The index retrieval searches, and what it notes about what it found."""

    async def search_terms(
        self,
        conversation_id: int,
        terms: Sequence[str],
        *,
        after_id: int,
        before_id: int,
        limit_per_term: int = 5000,
    ) -> list[list[int]]: ...

    async def outline(
        self, conversation_id: int, *, after_id: int, before_id: int
    ) -> list[tuple[int, str, int]]: ...

    async def add_vectors(self, rows: Sequence[tuple[int, int, str, Sequence[float]]]) -> int: ...

    async def messages_missing_vectors(
        self, model: str, *, limit: int, conversation_id: int | None = None, after_id: int = 0
    ) -> list[StoredMessage]: ...

    async def vector_search(
        self,
        conversation_id: int,
        query: Sequence[float],
        *,
        model: str,
        after_id: int,
        before_id: int,
        limit: int,
    ) -> list[tuple[int, float]]: ...

    async def note_retrieved(self, message_ids: Sequence[int]) -> None: ...

    async def save_recall_note(
        self, message_id: int, note: str, quoted: Sequence[int] = ()
    ) -> None: ...

    async def recall_notes(self, message_ids: Sequence[int]) -> dict[int, str]: ...
