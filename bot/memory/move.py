"""``meshsage migrate-store``: copy one store into another (SQLite <-> PostgreSQL) in one pass.

Invariants:
- The destination must be empty; the source is only read. Rows keep their ids, so every
  reference (a message's parent, a summary's range, a vector's message) stays valid.
- Tables are copied parents first, each in id order and in batches (bounded memory); the
  destination builds its own search index from the text as rows arrive.
- After the copy, every table's row count in the destination must equal the source's, or the
  command fails and says so: a partial copy is never reported as done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from bot.errors import StorageError

# (table, key column, columns) in the order parents before children.
TABLES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("conversations", "id", ("id", "transport", "person", "space", "created_at", "reset_after")),
    ("messages", "id", ("id", "conversation_id", "role", "author", "text", "created_at", "tokens",
                        "platform_id", "reply_to_platform_id", "parent_id", "status")),
    ("summaries", "id", ("id", "conversation_id", "text", "first_message_id", "last_message_id",
                         "tokens", "created_at")),
    ("facts", "id", ("id", "conversation_id", "text", "tokens", "created_at")),
    ("message_vectors", "message_id", ("message_id", "conversation_id", "model", "dim", "vector")),
)  # fmt: skip
BATCH = 2000


class Movable(Protocol):
    async def count_rows(self, table: str) -> int: ...

    async def export_rows(
        self, table: str, key: str, columns: tuple[str, ...], *, after: int, limit: int
    ) -> list[tuple[Any, ...]]: ...

    async def import_rows(
        self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
    ) -> None: ...

    async def finish_import(self) -> None: ...


Progress = Callable[[str, int, int], None]  # table, rows done, rows in all tables


async def copy_store(source: Movable, dest: Movable, *, progress: Progress) -> dict[str, int]:
    """Copy every table; return the verified row count per table."""
    if await dest.count_rows("conversations"):
        raise StorageError(
            "the destination store already holds conversations. Fix: migrate into an empty "
            "database (a new SQLite file, or a new PostgreSQL database)."
        )
    counts = {table: await source.count_rows(table) for table, _, _ in TABLES}
    total = sum(counts.values())
    done = 0
    for table, key, columns in TABLES:
        after = -1
        while True:
            rows = await source.export_rows(table, key, columns, after=after, limit=BATCH)
            if not rows:
                break
            await dest.import_rows(table, columns, rows)
            after = int(rows[-1][0])
            done += len(rows)
            progress(table, done, total)
    await dest.finish_import()
    for table, want in counts.items():
        got = await dest.count_rows(table)
        if got != want:
            raise StorageError(
                f"copy incomplete: {table} has {got} rows in the destination, {want} in the "
                "source. Fix: check the destination's logs, empty it and run again."
            )
    return counts


def bar(out: Callable[[str], object], width: int = 30) -> Progress:
    """A one-line progress bar written with ``out`` (stderr), redrawn in place."""

    def show(table: str, done: int, total: int) -> None:
        frac = done / total if total else 1.0
        filled = int(frac * width)
        out(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {frac:6.1%} {done:,}/{total:,} {table:<16}"
        )
        if done >= total:
            out("\n")

    return show
