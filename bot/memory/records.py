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


MSG_COLS = (
    "id, conversation_id, role, author, text, created_at, tokens, platform_id, parent_id, status"
)


def msg_from_row(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage(*row)
