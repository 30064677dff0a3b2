"""The memory port: what the responder, commands, context and summaries need from a store.

``SqliteStore`` implements it today; a PostgreSQL store for many bots sharing one memory would
implement the same Protocol and pass the same contract suite (tests/test_store_contract.py).

Invariants every implementation keeps:
- ``add_message`` is durable when it returns; ``answers=`` marks that message answered in the
  same transaction.
- Everything at or below a conversation's ``reset_after`` is invisible to ``recent_messages``,
  ``latest_summary``, ``search_terms``, ``outline`` and ``vector_search`` callers (they pass
  the mark), and ``save_summary`` refuses a summary that starts at or before it.
- Summaries are chapters: a saved summary replaces only the rows whose message range it
  covers, so folds append chapters and a merge (one row over several ranges) replaces them.
- ``forget_person`` removes every row about the person, search-index rows, vectors and outbox
  rows included; the physical erase is crash-safe (finished when the store next opens) and a
  repeated call erases again even when nothing is left to delete.
- ``recent_messages(before_id=Q)`` is the conversation as it stands for message Q: everything
  before Q plus the assistant answers to those messages, even when an answer was stored after
  Q (a second question sent before the first was answered).
- The outbox (``queue_delivery`` ... ``take_more``) is the durable list of what must still
  reach someone. ``queue_delivery(entry, answer=...)`` stores the assistant turn (the model's
  whole answer, status ``sending``), marks the question ``answered`` and adds the row in ONE
  transaction; without ``answer``, ``question_status`` is set on ``entry.question_id`` in that
  transaction. ``record_part`` records a part the platform accepted (never re-sent);
  ``finish_delivery`` ends a row (``delivered``/``sent``/``failed``/``expired``) and sets the
  answer message's status to the same value; ``undelivered`` lists ``pending`` rows oldest
  first with their recorded parts; ``take_more`` returns the ``rest`` of the newest answer (or
  ``more``) row of a conversation once, then clears it.
- ``search_terms``, ``outline`` and ``vector_search`` are scoped to one conversation and never
  read other people's rows; ``vector_search`` scores with the cosine similarity, best first.
- ``add_vectors`` skips messages that no longer exist; a message keeps one vector (the newest
  model's), and ``messages_missing_vectors`` lists what a model has not embedded yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bot.domain import ConversationKey
from bot.memory.records import OutboxEntry, OutboxRow, StoredAnswer
from bot.memory.store import Conversation, Fact, ForgetReport, StoredMessage, Summary


class MemoryStore(Protocol):
    async def close(self) -> None: ...

    async def conversation(self, key: ConversationKey) -> Conversation: ...

    async def find_conversation(self, key: ConversationKey) -> Conversation | None: ...

    async def conversations_of(self, transport: str, person: str) -> list[Conversation]: ...

    async def reset(self, conversation_id: int) -> int: ...

    async def forget_person(self, transport: str, person: str) -> ForgetReport: ...

    async def add_message(
        self,
        conversation_id: int,
        *,
        role: str,
        author: str,
        text: str,
        tokens: int,
        status: str,
        created_at: float | None = None,
        platform_id: str | None = None,
        reply_to_platform_id: str | None = None,
        parent_id: int | None = None,
        answers: int | None = None,
    ) -> int: ...

    async def pending_messages(
        self, *, since: float, transports: Sequence[str]
    ) -> list[tuple[ConversationKey, StoredMessage]]: ...

    async def set_status(
        self, message_id: int, status: str, *, platform_id: str | None = None
    ) -> None: ...

    async def known_platform_ids(
        self, transport: str, platform_ids: Sequence[str], *, since: float
    ) -> set[str]: ...

    async def recent_messages(
        self, conversation: Conversation, *, limit: int, before_id: int | None = None
    ) -> list[StoredMessage]: ...

    async def messages_between(
        self, conversation_id: int, *, after_id: int, up_to_id: int
    ) -> list[StoredMessage]: ...

    async def messages_by_ids(self, ids: Sequence[int]) -> list[StoredMessage]: ...

    async def ancestors(self, message_id: int, *, limit: int) -> list[StoredMessage]: ...

    async def all_messages(self, conversation_id: int) -> list[StoredMessage]: ...

    async def count_messages(self, conversation_id: int, *, since_reset: bool = False) -> int: ...

    async def count_person_messages(
        self, transport: str, person: str, *, space: str | None = None
    ) -> int: ...

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

    async def latest_summary(self, conversation: Conversation) -> Summary | None: ...

    async def summaries(self, conversation: Conversation) -> list[Summary]:
        """Summary chapters after the reset mark, oldest first (non-overlapping ranges)."""
        ...

    async def save_summary(
        self,
        conversation_id: int,
        *,
        text: str,
        first_message_id: int,
        last_message_id: int,
        tokens: int,
    ) -> bool: ...

    async def facts(self, conversation_id: int) -> list[Fact]: ...

    async def add_fact(self, conversation_id: int, *, text: str, tokens: int) -> int: ...

    async def remove_fact(self, conversation_id: int, fact_id: int) -> bool: ...

    async def stats(self) -> dict[str, int]: ...

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int: ...

    # --- the durable outbox (see the module docstring) ----------------------------------------
    async def queue_delivery(
        self,
        entry: OutboxEntry,
        *,
        answer: StoredAnswer | None = None,
        question_status: str | None = None,
    ) -> int: ...

    async def record_part(self, outbox_id: int, part: int, platform_id: str) -> None: ...

    async def finish_delivery(
        self, outbox_id: int, state: str, *, detail: str | None = None
    ) -> None: ...

    async def undelivered(self, *, transports: Sequence[str]) -> list[OutboxRow]: ...

    async def outbox_row(self, outbox_id: int) -> OutboxRow | None: ...

    async def take_more(self, key: ConversationKey) -> str | None: ...
