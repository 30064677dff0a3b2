"""Records the memory store returns, shared by every store implementation and its callers.

Invariants: frozen and platform-free; a ``StoredMessage`` is one row of the raw log.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    # The memory's incognito flag as read with the row (``conversation``/``find_conversation``),
    # so a message's intake needs no second read; ``is_incognito`` reads it fresh.
    incognito: bool = False


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
class ChatSetting:
    """The model and persona chosen for one scope (None: not set there)."""

    scope: str
    model: str | None
    persona: str | None


@dataclass(frozen=True, slots=True)
class EditedMessage:
    """A user message after the person edited it (``MemoryStore.edit_message``)."""

    message: StoredMessage
    old_status: str  # "pending", "answered", ... before the edit
    reopened: bool  # pending again, its answers withdrawn: to be answered anew


@dataclass(frozen=True, slots=True)
class Summary:
    id: int
    text: str
    first_message_id: int
    last_message_id: int
    tokens: int
    created_at: float


@dataclass(frozen=True, slots=True)
class FactChange:
    """An earlier value of a fact: its text, until when it held, whose it was (``pinned``: the
    person's own ``!remember``) and the message ids it came from."""

    text: str
    until: float
    pinned: bool
    source_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Fact:
    """``pinned`` facts came from ``!remember`` and extraction never changes them; extracted
    facts record the message ids they came from (``source_ids``) and when they last changed.
    ``history`` holds its earlier values, oldest first (a new value for the same subject
    replaced each, bot.memory.facts)."""

    id: int
    text: str
    tokens: int
    created_at: float
    pinned: bool = True
    source_ids: tuple[int, ...] = ()
    updated_at: float | None = None
    history: tuple[FactChange, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionSpan:
    """A closed session to record (``add_sessions``): its message ids, times and size."""

    first_message_id: int
    last_message_id: int
    started_at: float
    ended_at: float
    messages: int


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
    """One version of a conversation's long-term summary, built from the session summaries of
    every session ending at or before ``up_to_message_id``."""

    text: str
    tokens: int
    sessions: int
    up_to_message_id: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class ForgetReport:
    conversations: int
    messages: int
    summaries: int
    facts: int


# The export/import row shapes (``dump_person``/``load_dump``), shared by every store and by
# bot.memory.export: field names are the JSON keys, in this order.
CONVERSATION_FIELDS = ("id", "space", "created_at", "reset_after", "incognito")
MESSAGE_FIELDS = (
    "id", "role", "author", "text", "created_at", "tokens", "platform_id",
    "reply_to_platform_id", "parent_id", "status", "uses", "important",
)  # fmt: skip
SUMMARY_FIELDS = ("id", "text", "first_message_id", "last_message_id", "tokens", "created_at")
SESSION_FIELDS = (
    "id", "first_message_id", "last_message_id", "started_at", "ended_at", "messages", "title",
    "summary", "tokens",
)  # fmt: skip
FACT_FIELDS = (
    "id",
    "text",
    "tokens",
    "created_at",
    "updated_at",
    "pinned",
    "source_ids",
    "history",  # earlier values with provenance (migration 018); absent in older exports
)
LONGTERM_FIELDS = ("text", "tokens", "sessions", "up_to_message_id", "updated_at")
DUMP_TABLES = {
    "messages": MESSAGE_FIELDS,
    "summaries": SUMMARY_FIELDS,
    "sessions": SESSION_FIELDS,
    "facts": FACT_FIELDS,
}
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
    origin_id: int | None = None  # the linked DM it was asked in (``Conversation.origin_id``)
    created_at: float | None = None  # when it was written (the app's wall clock); None: now


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    entry: OutboxEntry
    state: str  # one of OUTBOX_STATES
    parts: tuple[tuple[int, str], ...]  # (part index, platform id) already delivered
    created_at: float
    answer_id: int | None  # the assistant message, for answers
    packet_ids: tuple[tuple[int, int], ...] = ()  # (part index, packet id) planned before a write
    # (part index, platform id) of messages a stream of this question's answer left on screen
    shown: tuple[tuple[int, str], ...] = ()


MSG_COLS = (
    "id, conversation_id, role, author, text, created_at, tokens, platform_id, parent_id, status"
)


def msg_from_row(row: Iterable[Any]) -> StoredMessage:
    return StoredMessage(*row)


HEARD_WINDOW_SECONDS = 3600.0  # a platform message id heard again within this is a duplicate


class AlreadyStored(Exception):
    """``add_message`` refused a user message this conversation already heard (same platform
    id within ``HEARD_WINDOW_SECONDS``): another gateway stored it and answers it."""

    def __init__(self, conversation_id: int, platform_id: str) -> None:
        super().__init__(f"message {platform_id} in conversation {conversation_id} stored already")
        self.conversation_id = conversation_id
        self.platform_id = platform_id


# One-off derived work a store ``claim`` hands to one process at a time, per conversation.
SUMMARY_CLAIM = 2
FACTS_CLAIM = 3


@dataclass(frozen=True, slots=True)
class HeldCommand:
    """A command stored before it ran and not answered yet (``held_commands``)."""

    id: int
    key: ConversationKey
    text: str
    platform_id: str | None
    author: str | None
    created_at: float
    done: bool = False  # its effect committed before the kill: told, never run again
    authenticated: bool = False  # its sender was (bot.trust): the replay is judged the same


@dataclass(frozen=True, slots=True)
class KeyPin:
    """The public key pinned for a node (``key_pins``, bot.transports.mesh_keys)."""

    transport: str
    person: str
    public_key: bytes
    pinned_at: float
