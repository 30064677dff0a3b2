"""Open the configured memory store: SQLite (a file; the default) or PostgreSQL (a URL).

Invariants:
- ``asyncpg`` is imported only for a ``postgresql://`` URL, so SQLite installs never need it;
  without it, opening fails with a ``StorageError`` that says which extra to install.
- The PostgreSQL password is read from the environment variable the config names, never from
  the config file; a variable that is named but unset is an error, not an empty password.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from bot.errors import StorageError
from bot.memory.sqlite import SqliteStore

if TYPE_CHECKING:
    from bot.memory.postgres import PostgresStore


async def open_url(
    url: str,
    *,
    password_env: str | None = None,
    env: Mapping[str, str],
    gateway: str | None = None,
    copying: bool = False,
) -> SqliteStore | PostgresStore:
    """``sqlite:///path`` or ``postgresql://user@host[:port]/database``; ``gateway`` names
    this gateway on PostgreSQL (``PgBase.gateway``); ``copying``: migrate-store's destination,
    which may hold its own unfinished copy (``core.versions.COPY_MARK``)."""
    if url.startswith("sqlite://"):
        return await SqliteStore.open(Path(url.removeprefix("sqlite://")), copying=copying)
    if not url.startswith(("postgresql://", "postgres://")):
        raise StorageError(
            f"unknown store URL {url!r}. Fix: use sqlite:///path/to/meshsage.db or "
            "postgresql://user@host/database."
        )
    password = None
    if password_env is not None:
        password = env.get(password_env)
        if password is None:
            raise StorageError(
                f"storage.password_env names {password_env}, which is not set. Fix: set it "
                "(the unit's Environment= or /etc/meshsage/env), or remove password_env."
            )
    try:
        from bot.memory.postgres import PostgresStore
    except ImportError as exc:
        if exc.name != "asyncpg":
            raise
        raise StorageError(
            "a postgresql:// store needs asyncpg, which is not installed. Fix: "
            "pip install 'meshsage[postgres]' (or leave storage.url out for SQLite)."
        ) from None
    return await PostgresStore.open(url, password=password, gateway=gateway, copying=copying)
