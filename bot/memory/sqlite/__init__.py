"""The SQLite memory store, one module per table family sharing one connection
(``base``): conversations and messages, the outbox, search and vectors, summaries and facts, upkeep.

The raw log (``messages``) is the ground truth; summaries and facts are derived from it and
record which messages they cover.
"""

from __future__ import annotations

from bot.memory.sqlite.derived import DerivedMixin
from bot.memory.sqlite.messages import MessagesMixin
from bot.memory.sqlite.outbox import OutboxMixin
from bot.memory.sqlite.search import SearchMixin
from bot.memory.sqlite.upkeep import UpkeepMixin


class SqliteStore(MessagesMixin, OutboxMixin, SearchMixin, DerivedMixin, UpkeepMixin):
    """Open with ``await SqliteStore.open(path)``; close with ``await store.close()``."""


__all__ = ["SqliteStore"]
