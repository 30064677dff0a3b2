"""The memory store's public names: ``SqliteStore`` (bot.memory.sqlite) and its records
(bot.memory.records). Import from here. The table families are written once for both backends
in ``bot.memory.core``; what a consumer may ask of a store is ``bot.memory.port``."""

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
