"""The SQLite memory store: the table families written once in ``bot.memory.core``
(conversations and messages, the outbox, search and vectors, summaries and facts, sessions and
long-term summaries, linked identities and incognito, export/import rows, upkeep) over this
package's connection (``base``), full-text search and vectors (``search``) and erase and tidy
(``upkeep``). It implements every Protocol of ``bot.memory.port``.

The raw log (``messages``) is the ground truth; summaries and facts are derived from it and
record which messages they cover.
"""

from __future__ import annotations

from bot.memory.core.derived import DerivedMixin
from bot.memory.core.identity import IdentityMixin
from bot.memory.core.messages import MessagesMixin
from bot.memory.core.outbox import OutboxMixin
from bot.memory.core.portable import PortableMixin
from bot.memory.core.sessions import SessionsMixin
from bot.memory.core.settings import SettingsMixin
from bot.memory.core.upkeep import UpkeepMixin
from bot.memory.sqlite.base import SqliteBase
from bot.memory.sqlite.search import SearchMixin
from bot.memory.sqlite.upkeep import SqliteUpkeepMixin


class SqliteStore(
    MessagesMixin,
    OutboxMixin,
    SearchMixin,
    DerivedMixin,
    SessionsMixin,
    SettingsMixin,
    IdentityMixin,
    PortableMixin,
    UpkeepMixin,
    SqliteUpkeepMixin,
    SqliteBase,
):
    """Open with ``await SqliteStore.open(path)``; close with ``await store.close()``."""


__all__ = ["SqliteStore"]
