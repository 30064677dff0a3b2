"""The memory store's public names: ``SqliteStore`` (bot.memory.sqlite) and its records
(bot.memory.records). Import from here; the table families live in ``bot.memory.sqlite``."""

from __future__ import annotations

from bot.memory.records import (
    ASSISTANT,
    USER,
    Conversation,
    Fact,
    ForgetReport,
    LongTermSummary,
    Session,
    StoredMessage,
    Summary,
)
from bot.memory.sqlite import SqliteStore

__all__ = [
    "ASSISTANT",
    "USER",
    "Conversation",
    "Fact",
    "ForgetReport",
    "LongTermSummary",
    "Session",
    "SqliteStore",
    "StoredMessage",
    "Summary",
]
