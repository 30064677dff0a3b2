"""Records the memory store returns, shared by every store implementation and its callers.

Invariants: frozen and platform-free; a ``StoredMessage`` is one row of the raw log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.domain import ConversationKey

USER = "user"
ASSISTANT = "assistant"


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    key: ConversationKey
    reset_after: int


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    author: str
    text: str
    created_at: float
    tokens: int
    platform_id: str | None
    parent_id: int | None
    status: str


@dataclass(frozen=True, slots=True)
class Summary:
    id: int
    text: str
    first_message_id: int
    last_message_id: int
    tokens: int
    created_at: float


@dataclass(frozen=True, slots=True)
class Fact:
    id: int
    text: str
    tokens: int
    created_at: float


@dataclass(frozen=True, slots=True)
class ForgetReport:
    conversations: int
    messages: int
    summaries: int
    facts: int


OUTBOX_KINDS = ("answer", "notice", "command", "more")
OUTBOX_STATES = ("pending", "sent", "delivered", "failed", "expired")


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """Text that must reach one person: an answer, a notice that matters, a command's reply, or
    the next parts of a cut answer (``more``). ``text`` is exactly what the transport sends."""

    key: ConversationKey
    kind: str  # one of OUTBOX_KINDS
    text: str
    reply_to: str | None = None  # platform id of the message this answers
    question_id: int | None = None  # the stored user message it answers, if any
    rest: str | None = None  # what a cut answer left for ``!more``


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """The model's whole answer, stored as the assistant turn (the radio may send less)."""

    conversation_id: int
    author: str
    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    entry: OutboxEntry
    state: str  # one of OUTBOX_STATES
    parts: tuple[tuple[int, str], ...]  # (part index, platform id) already delivered
    created_at: float
    answer_id: int | None  # the assistant message, for answers


MSG_COLS = (
    "id, conversation_id, role, author, text, created_at, tokens, platform_id, parent_id, status"
)


def msg_from_row(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage(*row)
