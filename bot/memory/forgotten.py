"""Whether a conversation is still in the store: background memory work (chapters, merges)
asks before every model call, so a ``!forget`` on any gateway sends nothing more.

Invariants:
- ``gone`` is True only when the store answered and the conversation is not there (or its
  key now belongs to another conversation: an ``!unlink`` moved it); a store that fails is
  "not known to be gone" (the caller's own error handling reports the failure).
- ``still_there`` raises ``Forgotten`` when ``gone``; callers end their work quietly on it.
"""

from __future__ import annotations

import sqlite3

from bot.errors import StorageError
from bot.memory.port_log import ConversationLog
from bot.memory.records import Conversation


class Forgotten(Exception):
    """The conversation was forgotten while background work on it was in flight."""


async def gone(store: ConversationLog, conversation: Conversation) -> bool:
    try:
        found = await store.find_conversation(conversation.key)
    except (sqlite3.Error, StorageError):  # not known to be gone (the caller reports it)
        return False
    return found is None or found.id != conversation.id


async def still_there(store: ConversationLog, conversation: Conversation) -> None:
    """Called right before a model call: raises ``Forgotten`` when the conversation is no
    longer in the store, so nothing it held is sent again."""
    if await gone(store, conversation):
        raise Forgotten(conversation.id)
