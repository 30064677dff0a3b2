"""The upkeep ports: the store's lifecycle, forgetting (``!forget``, pruning by age and by
use), counts, a person's export/import (``Upkeep``, ``bot.memory.core.upkeep`` and
``core.portable``) and the whole-store copy of ``meshsage migrate-store`` (``Movable``,
``bot.memory.move`` decides).

Invariants every implementation keeps:
- ``forget_person`` removes every row about the person, search-index rows, vectors, outbox
  rows and the person's key pin included; the physical erase is crash-safe (finished when
  the store next opens) and a repeated call erases again even when nothing is left to delete.
- ``prune_by_use`` never deletes important messages (``mark_important``), the sources of
  pinned facts, or messages awaiting an answer; every deletion takes the message's index and
  vector rows with it. ``prune_older_than`` deletes by age in batches, with the same rows.
- ``dump_person`` is deterministic; ``load_dump`` is one transaction and refuses taken ids.
- ``ping`` is one trivial query through the store's connection (the watchdog's proof that it
  is not wedged); ``tidy`` is upkeep for idle moments and changes no row.
- ``mark_copy(unfinished=True)`` makes every other opening of the store refuse it until
  ``mark_copy(unfinished=False)``; ``import_rows`` keeps the rows' ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from bot.memory.records import ForgetReport


class Upkeep(Protocol):
    """Close, check, count, forget and prune, export and import one person."""

    async def close(self) -> None: ...

    async def ping(self) -> None: ...

    async def tidy(self) -> None: ...

    async def stats(self) -> dict[str, int]: ...

    async def messages_since(self, since: float) -> dict[str, int]:
        """Messages per role created at or after ``since`` (the status file's daily counts)."""
        ...

    async def forget_person(self, transport: str, person: str) -> ForgetReport: ...

    async def mark_important(
        self, conversation_id: int, message_ids: Sequence[int], *, done: int | None = None
    ) -> int: ...

    async def prune_by_use(self, max_per_conversation: int, *, batch: int = 500) -> int: ...

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int: ...

    async def dump_person(self, transport: str, person: str) -> list[dict[str, Any]]: ...

    async def load_dump(
        self, transport: str, person: str, conversations: list[dict[str, Any]]
    ) -> dict[str, int]: ...


class Movable(Protocol):
    """Table by table, what ``meshsage migrate-store`` reads from one store and writes into
    another."""

    async def table_columns(self, table: str) -> list[str]: ...

    async def count_rows(self, table: str) -> int: ...

    async def export_rows(
        self, table: str, key: str, columns: tuple[str, ...], *, after: int, limit: int
    ) -> list[tuple[Any, ...]]: ...

    async def import_rows(
        self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
    ) -> None: ...

    async def update_rows(
        self, table: str, key: str, column: str, rows: list[tuple[Any, Any]]
    ) -> None: ...

    async def finish_import(self) -> None: ...

    async def copy_unfinished(self) -> bool: ...

    async def mark_copy(self, *, unfinished: bool) -> None: ...

    async def empty_tables(self, tables: Sequence[str]) -> None: ...
