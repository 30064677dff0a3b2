"""The memory port: what the responder, commands, context and summaries need from a store.

``SqliteStore`` (one process on a Pi) and ``PostgresStore`` (several gateways sharing one
memory) implement it and pass the same contract suite (tests/test_store_contract*.py).

Invariants every implementation keeps:
- ``add_message`` is durable when it returns; ``answers=`` marks that message answered in the
  same transaction.
- Everything at or below a conversation's ``reset_after`` is invisible to ``recent_messages``,
  ``latest_summary``, ``search_terms``, ``outline`` and ``vector_search`` callers (they pass
  the mark), and ``save_summary`` refuses a summary that starts at or before it.
- Summaries are chapters: a saved summary replaces only the rows whose message range it
  covers, so folds append chapters and a merge (one row over several ranges) replaces them.
- ``forget_person`` removes every row about the person, search-index rows, vectors, outbox
  rows and the person's key pin included; the physical erase is crash-safe (finished when
  the store next opens) and a repeated call erases again even when nothing is left to delete.
- ``recent_messages(before_id=Q)`` is the conversation as it stands for message Q: everything
  before Q plus the assistant answers to those messages, even when an answer was stored after
  Q (a second question sent before the first was answered).
- Finished outbox rows are deleted by ``prune_outbox`` (the app runs it every maintenance
  round, whatever the retention settings, bot.memory.keep) and, holding a fact's text, by
  ``scrub_outbox`` (``!unremember``); pending rows never.
- The outbox (``queue_delivery`` ... ``take_more``) is the durable list of what must still
  reach someone. ``queue_delivery(entry, answer=...)`` stores the assistant turn (the model's
  whole answer, status ``sending``), marks the question ``answered`` and adds the row in ONE
  transaction; without ``answer``, ``question_status`` is set on ``entry.question_id`` in that
  transaction. ``record_part`` records a part the platform accepted (never re-sent);
  ``finish_delivery`` ends a row (``delivered``/``sent``/``failed``/``expired``) and sets the
  answer message's status to the same value; ``undelivered`` lists ``pending`` rows oldest
  first with their recorded parts; ``take_more`` returns the ``rest`` of the newest answer (or
  ``more``) row of a conversation once, then clears it. A row is sent only under its claim
  (``claim_delivery``, a compare-and-set; ``queue_delivery(claim=True)``, or
  ``queue_claimed``, which also returns the new row as ``outbox_row`` reads it); ``undelivered``
  lists only unclaimed rows; ``release_stale_claims`` frees the claims of this gateway's dead
  processes at start; ``plan_part`` fixes a part's packet id before it is written (see
  ``bot.memory.outbox_claims``). ``record_shown`` keeps, by question, the messages a streamed
  answer put on screen (``OutboxRow.shown``; cleared by ``finish_delivery``).
- ``pending_messages`` lists every pending question, oldest first (each is answered on its
  own; with ``stale_before`` only those whose gateway died); ``mark_answered`` marks pending
  questions answered; ``claim_question`` is a compare-and-set that takes a pending question
  only when its claim is free, ours, or stale (bot.memory.keep).
- ``search_terms``, ``outline`` and ``vector_search`` are scoped to one conversation and never
  read other people's rows; ``vector_search`` scores with the cosine similarity, best first.
- A user message whose platform id the conversation already stored within
  ``HEARD_WINDOW_SECONDS`` makes ``add_message`` raise ``AlreadyStored`` (a message heard by
  two gateways is stored, and answered, once).
- ``turn_lock`` makes a conversation's turns one at a time across every process sharing the
  store; ``claim`` hands one-off derived work (``SUMMARY_CLAIM``, ``FACTS_CLAIM``) to one
  holder at a time and never waits.
- Database failures surface as ``StorageError`` or ``sqlite3.Error`` (SQLite only).
- ``add_vectors`` skips messages that no longer exist; a message keeps one vector (the newest
  model's), and ``messages_missing_vectors`` lists what a model has not embedded yet.
- Sessions of a conversation never overlap (``add_session`` returns None instead,
  ``add_sessions`` skips the span); they are
  ordered by message id, never by clock.
- Pinned facts (``!remember``) are never changed by ``update_fact`` or by
  ``remove_fact(extracted_only=True)``; ``revise_fact`` (a new value for the same subject)
  may change any fact. Both keep the replaced text in the fact's ``history`` (at most
  ``FACT_HISTORY`` entries), which goes with the fact when it is removed or forgotten.
- ``prune_by_use`` never deletes important messages, the sources of pinned facts, or messages
  awaiting an answer; every deletion takes the message's index and vector rows with it.
- ``link_dm`` moves one DM conversation's rows into another and marks them with their origin;
  ``unlink_dm`` moves exactly those back. ``find_conversation``/``conversation`` of an absorbed
  DM return the home with ``origin_id`` set; ``add_message(origin_id=...)`` falls back to the
  origin when the link is gone. Channel spaces never link.
- Incognito: ``set_incognito`` and ``end_incognito`` (``!incognito``, ``!reset``, ``!forget``)
  give the conversation (and those linked with it) a new stretch id, or none when off;
  ``incognito_stretch`` reads it, so every gateway sees a stretch end (bot.memory.stretch).
- ``pin_key`` pins a person's public key only where none is pinned (unless ``replace``) and
  returns the key pinned now, so two gateways pinning at once agree (bot.transports.mesh_keys).
- A recall note records the messages it quotes (``save_recall_note(quoted=...)``); no
  deletion or unlink leaves a note quoting a message gone from its conversation.
- ``facts_through`` (the fact extraction mark) only moves forward; ``load_dump`` sets it past
  the imported messages (their facts are imported with them). ``link_dm`` keeps the promise
  that each message is read for facts once: the home's mark becomes the later of both marks,
  and the messages of either side past their own mark but not past it are flagged
  (``facts_pending``) and read by the next extraction.
- ``dump_person`` is deterministic; ``load_dump`` is one transaction and refuses taken ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from bot.domain import ConversationKey
from bot.memory.records import (
    ChatSetting,
    EditedMessage,
    HeldCommand,
    KeyPin,
    LongTermSummary,
    OutboxEntry,
    OutboxRow,
    Session,
    SessionSpan,
    StoredAnswer,
)
from bot.memory.store import Conversation, Fact, ForgetReport, StoredMessage, Summary


class MemoryStore(Protocol):
    async def close(self) -> None: ...

    async def conversation(self, key: ConversationKey) -> Conversation: ...

    async def find_conversation(self, key: ConversationKey) -> Conversation | None: ...

    async def conversations_of(self, transport: str, person: str) -> list[Conversation]: ...

    async def reset(self, conversation_id: int, *, done: int | None = None) -> int: ...

    async def reset_mark(self, conversation_id: int) -> int: ...

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
        origin_id: int | None = None,
    ) -> int: ...

    async def edit_message(
        self,
        conversation_id: int,
        platform_id: str,
        *,
        text: str,
        tokens: int,
        reopen: bool = False,
        withdrawn: str = "",
    ) -> EditedMessage | None: ...

    async def chat_settings(self, scopes: Sequence[str] | None = None) -> list[ChatSetting]: ...

    async def set_chat_setting(
        self, scope: str, field: str, value: str | None, *, done: int | None = None
    ) -> None: ...

    def turn_lock(self, conversation_id: int) -> AbstractAsyncContextManager[None]: ...

    def claim(self, kind: int, conversation_id: int) -> AbstractAsyncContextManager[bool]: ...

    async def pending_messages(
        self, *, since: float, transports: Sequence[str], stale_before: float | None = None
    ) -> list[tuple[ConversationKey, StoredMessage]]: ...

    async def set_status(
        self, message_id: int, status: str, *, platform_id: str | None = None
    ) -> None: ...

    async def mark_answered(self, conversation_id: int, ids: Sequence[int]) -> int: ...

    async def claim_question(self, message_id: int, *, stale_before: float) -> bool: ...

    async def hold_command(
        self,
        key: ConversationKey,
        text: str,
        *,
        platform_id: str | None,
        author: str | None,
        authenticated: bool = False,
    ) -> int: ...

    async def release_command(self, command_id: int) -> None: ...

    async def held_commands(self, *, transports: Sequence[str]) -> list[HeldCommand]: ...

    async def waiting_replies(self) -> dict[str, int]: ...

    async def known_platform_ids(
        self, transport: str, platform_ids: Sequence[str], *, since: float
    ) -> set[str]: ...

    async def recent_messages(
        self, conversation: Conversation, *, limit: int, before_id: int | None = None
    ) -> list[StoredMessage]: ...

    async def messages_between(
        self, conversation_id: int, *, after_id: int, up_to_id: int
    ) -> list[StoredMessage]: ...

    async def messages_with_notes(
        self, conversation_id: int, *, after_id: int, up_to_id: int
    ) -> tuple[list[StoredMessage], dict[int, str]]: ...

    async def message_by_platform_id(
        self, conversation_id: int, platform_id: str
    ) -> int | None: ...

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
    ) -> int: ...

    async def update_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        text: str,
        tokens: int,
        source_ids: Sequence[int],
        updated_at: float | None = None,
    ) -> bool: ...

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
    ) -> Fact | None: ...

    async def remove_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        extracted_only: bool = False,
        done: int | None = None,
    ) -> bool: ...

    # --- sessions and long-term summaries ---------------------------------------------------
    async def sessions(self, conversation_id: int, *, limit: int = 1000) -> list[Session]: ...

    async def session_end(self, conversation_id: int) -> int: ...

    async def add_session(
        self,
        conversation_id: int,
        *,
        first_message_id: int,
        last_message_id: int,
        started_at: float,
        ended_at: float,
        messages: int,
    ) -> int | None: ...

    async def add_sessions(self, conversation_id: int, spans: Sequence[SessionSpan]) -> list[int]:
        """Several closed sessions (message order) in one transaction; new ids in order."""
        ...

    async def set_session_summary(
        self, session_id: int, *, title: str, summary: str, tokens: int
    ) -> bool: ...

    async def clear_sessions(self, conversation_id: int) -> int: ...

    async def unsummarized_sessions(
        self, *, limit: int, ended_after: float = 0.0
    ) -> list[Session]: ...

    async def idle_conversations(self, *, idle_before: float, limit: int) -> list[int]: ...

    async def longterm_summary(
        self,
        conversation_id: int,
        *,
        up_to: int | None = None,
        written_before: float | None = None,
    ) -> LongTermSummary | None: ...

    async def has_longterm_summary(self, conversation_id: int) -> bool: ...

    async def save_longterm_summary(
        self,
        conversation_id: int,
        *,
        text: str,
        tokens: int,
        sessions: int,
        up_to_message_id: int,
        updated_at: float | None = None,
    ) -> None: ...

    # --- forgetting by use, identities, incognito, export/import ----------------------------
    async def note_retrieved(self, message_ids: Sequence[int]) -> None: ...

    async def save_recall_note(
        self, message_id: int, note: str, quoted: Sequence[int] = ()
    ) -> None: ...

    async def recall_notes(self, message_ids: Sequence[int]) -> dict[int, str]: ...

    async def mark_important(
        self, conversation_id: int, message_ids: Sequence[int], *, done: int | None = None
    ) -> int: ...

    async def prune_by_use(self, max_per_conversation: int, *, batch: int = 500) -> int: ...

    async def link_dm(
        self, home: ConversationKey, other: ConversationKey, *, done: int | None = None
    ) -> int: ...

    async def unlink_dm(self, key: ConversationKey, *, done: int | None = None) -> int | None: ...

    async def set_incognito(self, conversation_id: int, on: bool) -> None: ...

    async def is_incognito(self, conversation_id: int) -> bool: ...

    async def incognito_stretch(self, conversation_id: int) -> str | None: ...

    async def end_incognito(self, transport: str, person: str, *, space: str | None) -> int: ...

    async def key_pin(self, transport: str, person: str) -> KeyPin | None: ...

    async def pin_key(
        self,
        transport: str,
        person: str,
        key: bytes,
        *,
        replace: bool = False,
        pinned_at: float | None = None,
    ) -> bytes: ...

    async def unpin_key(self, transport: str, person: str) -> bool: ...

    async def key_pins(self) -> list[KeyPin]: ...

    async def facts_through(self, conversation_id: int) -> int: ...

    async def set_facts_through(self, conversation_id: int, message_id: int) -> None: ...

    async def facts_pending(self, conversation_id: int) -> list[StoredMessage]: ...

    async def dump_person(self, transport: str, person: str) -> list[dict[str, Any]]: ...

    async def load_dump(
        self, transport: str, person: str, conversations: list[dict[str, Any]]
    ) -> dict[str, int]: ...

    async def stats(self) -> dict[str, int]: ...

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int: ...

    async def prune_outbox(self, before: float, *, batch: int = 500) -> int: ...

    async def scrub_outbox(self, conversation_id: int, text: str) -> int: ...

    # --- the durable outbox (see the module docstring) ----------------------------------------
    async def queue_delivery(
        self,
        entry: OutboxEntry,
        *,
        answer: StoredAnswer | None = None,
        question_status: str | None = None,
        claim: bool = False,
    ) -> int: ...

    async def queue_claimed(
        self,
        entry: OutboxEntry,
        *,
        answer: StoredAnswer | None = None,
        question_status: str | None = None,
        release: int | None = None,
    ) -> OutboxRow: ...

    @property
    def claim_owner(self) -> str: ...

    async def claim_delivery(self, outbox_id: int) -> OutboxRow | None: ...

    async def release_delivery(self, outbox_id: int) -> None: ...

    async def release_stale_claims(self) -> int: ...

    async def plan_part(self, outbox_id: int, part: int, packet_id: int) -> int: ...

    async def record_part(self, outbox_id: int, part: int, platform_id: str) -> None: ...

    async def record_shown(self, question_id: int, part: int, platform_id: str | None) -> None: ...

    async def shown_parts(self, question_id: int) -> tuple[tuple[int, str], ...]: ...

    async def finish_delivery(
        self, outbox_id: int, state: str, *, detail: str | None = None
    ) -> None: ...

    async def undelivered(self, *, transports: Sequence[str]) -> list[OutboxRow]: ...

    async def outbox_row(self, outbox_id: int) -> OutboxRow | None: ...

    async def take_more(self, key: ConversationKey) -> str | None: ...
