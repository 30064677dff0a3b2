"""The conversation log port: conversations and their messages, the raw log every other part
of memory derives from (``bot.memory.core.messages`` implements it for both backends).

Invariants every implementation keeps:
- ``conversation`` is get-or-create; ``find_conversation``/``conversation`` of a DM absorbed by
  ``link_dm`` return the home with ``origin_id`` set, and ``add_message(origin_id=...)`` falls
  back to the origin when the link is gone.
- ``add_message`` is durable when it returns; ``answers=`` marks that message answered in the
  same transaction. A user message whose platform id the conversation already stored within
  ``HEARD_WINDOW_SECONDS`` makes it raise ``AlreadyStored`` (a message heard by two gateways is
  stored, and answered, once).
- Everything at or below a conversation's ``reset_after`` (``reset``, ``reset_mark``) is
  invisible to ``recent_messages`` and to the callers of the derived and recall reads, which
  pass the mark.
- ``recent_messages(before_id=Q)`` is the conversation as it stands for message Q: everything
  before Q plus the assistant answers to those messages, even when an answer was stored after
  Q (a second question sent before the first was answered).
- ``edit_message`` replaces a user message's text and search words; only the newest changed
  question is reopened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bot.domain import ConversationKey
from bot.memory.records import Conversation, EditedMessage, StoredMessage


class ConversationLog(Protocol):
    """Conversations and the messages stored in them."""

    async def conversation(self, key: ConversationKey) -> Conversation: ...

    async def find_conversation(self, key: ConversationKey) -> Conversation | None: ...

    async def conversations_of(self, transport: str, person: str) -> list[Conversation]: ...

    async def reset(self, conversation_id: int, *, done: int | None = None) -> int: ...

    async def reset_mark(self, conversation_id: int) -> int: ...

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

    async def add_messages(
        self, conversation_id: int, rows: Sequence[tuple[str, str, str, int, float]]
    ) -> None:
        """Bulk insert (role, author, text, tokens, created_at) in one transaction."""
        ...

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
