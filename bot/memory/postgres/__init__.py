"""The PostgreSQL memory store, for several gateways sharing one memory: the table families of
``bot.memory.core``, as for SQLite (``bot.memory.sqlite``), over one pool (``base``), with this
package's search, upkeep and derived rows. It implements every Protocol of ``bot.memory.port``.

Importing this package imports ``asyncpg`` (the optional ``meshsage[postgres]`` extra): only
``bot.memory.open`` does, and only for a ``postgresql://`` URL, so a Pi never needs it.
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
from bot.memory.postgres.base import PgBase
from bot.memory.postgres.rows import RowsMixin
from bot.memory.postgres.search import SearchMixin
from bot.memory.postgres.upkeep import PgUpkeepMixin


class PostgresStore(
    MessagesMixin,
    OutboxMixin,
    SearchMixin,
    DerivedMixin,
    SessionsMixin,
    SettingsMixin,
    IdentityMixin,
    PortableMixin,
    UpkeepMixin,
    PgUpkeepMixin,
    RowsMixin,
    PgBase,
):
    """Open with ``await PostgresStore.open(url, password=...)``; close with ``close()``."""


__all__ = ["PostgresStore"]
