"""The durable work queue's ports: the outbox (``Outbox``: what must still reach someone,
``bot.memory.core.outbox``), the questions and held commands waiting to be dealt with
(``WorkQueue``) and the locks and claims that give work to one holder across every process
sharing the store (``Claims``, each backend's ``base``).

Invariants every implementation keeps:
- ``queue_delivery(entry, answer=...)`` stores the assistant turn (the model's whole answer,
  status ``sending``), marks the question ``answered`` and adds the row in ONE transaction;
  without ``answer``, ``question_status`` is set on ``entry.question_id`` in that transaction.
- ``record_part`` records a part the platform accepted (never re-sent); ``finish_delivery``
  ends a row (``delivered``/``sent``/``failed``/``expired``) and sets the answer message's
  status to the same value; ``undelivered`` lists ``pending`` rows oldest first with their
  recorded parts; ``take_more`` returns the ``rest`` of the newest answer (or ``more``) row
  of a conversation once, then clears it.
- A row is sent only under its claim (``claim_delivery``, a compare-and-set;
  ``queue_delivery(claim=True)``, or ``queue_claimed``, which also returns the new row as
  ``outbox_row`` reads it); ``undelivered`` lists only unclaimed rows;
  ``release_stale_claims`` frees the claims of this gateway's dead processes at start;
  ``plan_part`` fixes a part's packet id before it is written (see
  ``bot.memory.outbox_claims``). ``record_shown`` keeps, by question, the messages a streamed
  answer put on screen (``OutboxRow.shown``; cleared by ``finish_delivery``).
- Finished outbox rows are deleted by ``prune_outbox`` (the app runs it every maintenance
  round, whatever the retention settings, bot.memory.keep) and, holding a fact's text, by
  ``scrub_outbox`` (``!unremember``); pending rows never.
- ``outbox_gateway`` is the gateway whose rows ``undelivered``, ``outbox_by_state`` and
  ``waiting_replies`` count (PostgreSQL), None where the store has one gateway (SQLite).
- ``pending_messages`` lists every pending question, oldest first (each is answered on its
  own; with ``stale_before`` only those whose gateway died); ``mark_answered`` marks pending
  questions answered; ``claim_question`` is a compare-and-set that takes a pending question
  only when its claim is free, ours, or stale (bot.memory.keep).
- A held command (``hold_command``) is listed by ``held_commands`` until ``release_command``;
  its effect's write passes ``done=<id>`` so the mark commits with the effect.
- ``turn_lock`` makes a conversation's turns one at a time across every process sharing the
  store; ``claim`` hands one-off derived work (``SUMMARY_CLAIM``, ``FACTS_CLAIM``) to one
  holder at a time and never waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from bot.domain import ConversationKey
from bot.memory.records import HeldCommand, OutboxEntry, OutboxRow, StoredAnswer, StoredMessage


class Outbox(Protocol):
    """Answers and notices that must still reach someone, with their progress."""

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

    @property
    def outbox_gateway(self) -> str | None: ...

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

    async def waiting_replies(self) -> dict[str, int]: ...

    async def outbox_by_state(self) -> dict[str, tuple[int, float]]:
        """This gateway's rows by state: (how many, the oldest's ``created_at``); states
        without rows are absent."""
        ...

    async def outbox_gateways(self, *, since: float) -> list[tuple[str, float]]:
        """Other gateways that wrote a row after ``since``, by name, with the newest
        ``updated_at`` (none where the store has one gateway)."""
        ...

    async def prune_outbox(self, before: float, *, batch: int = 500) -> int: ...

    async def scrub_outbox(self, conversation_id: int, text: str) -> int: ...


class WorkQueue(Protocol):
    """Questions waiting for an answer and commands waiting to run, kept across restarts."""

    async def pending_messages(
        self, *, since: float, transports: Sequence[str], stale_before: float | None = None
    ) -> list[tuple[ConversationKey, StoredMessage]]: ...

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


class Claims(Protocol):
    """One holder at a time, across every process sharing the store."""

    def turn_lock(self, conversation_id: int) -> AbstractAsyncContextManager[None]: ...

    def claim(self, kind: int, conversation_id: int) -> AbstractAsyncContextManager[bool]: ...
