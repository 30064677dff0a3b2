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
    """``id`` is where the conversation's memory lives. For a DM linked to another transport's
    DM (``!link``) that is the other conversation's id, and ``origin_id`` is this key's own
    conversation, so new messages can be handed back at ``!unlink``."""

    id: int
    key: ConversationKey
    reset_after: int
    origin_id: int | None = None


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
    """``pinned`` facts came from ``!remember`` and extraction never changes them; extracted
    facts record the message ids they came from (``source_ids``) and when they last changed."""

    id: int
    text: str
    tokens: int
    created_at: float
    pinned: bool = True
    source_ids: tuple[int, ...] = ()
    updated_at: float | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """A run of messages without an idle gap longer than ``memory.session_gap`` (or a
    ``!reset``). ``title``/``summary`` are None until the background summary is written."""

    id: int
    conversation_id: int
    first_message_id: int
    last_message_id: int
    started_at: float
    ended_at: float
    messages: int
    title: str | None
    summary: str | None
    tokens: int


@dataclass(frozen=True, slots=True)
class LongTermSummary:
    text: str
    tokens: int
    sessions: int
    updated_at: float


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
