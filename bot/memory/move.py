"""``meshsage migrate-store``: copy one store into another (SQLite <-> PostgreSQL) in one pass.

Invariants:
- The destination must be empty; the source is only read. Rows keep their ids, so every
  reference (a message's parent, a summary's range, a vector's message) stays valid.
- Tables are copied parents first (``ORDER``), each in key order and in batches (bounded
  memory), with every column both stores have: a column or table the source has and the
  destination lacks stops the copy before anything is lost (``StorageError``). Columns a store
  derives itself (PostgreSQL's ``search`` words) are not copied; the destination builds them.
- References that may point forward (``DEFERRED``: a linked DM's home may be a newer row) are
  written after every row exists.
- After the copy, every table's row count in the destination must equal the source's, or the
  command fails and says so: a partial copy is never reported as done.
- A copy is marked unfinished in the destination before its first row and unmarked only after
  the counts are verified (``core.versions.COPY_MARK``): the bot, ``doctor`` and every other
  command refuse a store so marked, and running migrate-store again empties it and starts over.
  An interrupted copy is never used as the memory, and never mistaken for a user's data either.
"""

from __future__ import annotations

from collections.abc import Callable

from bot.errors import StorageError
from bot.memory.port_upkeep import Movable

# (table, key column) parents first; tables a store does not have are skipped.
ORDER: tuple[tuple[str, str], ...] = (
    ("conversations", "id"),
    ("messages", "id"),
    ("summaries", "id"),
    ("facts", "id"),
    ("message_vectors", "message_id"),
    ("sessions", "id"),
    ("longterm_summaries", "id"),
    ("outbox", "id"),
    ("outbox_parts", "outbox_id"),
    ("outbox_packets", "outbox_id"),
    ("shown_parts", "question_id"),
    ("chat_settings", "updated_at"),  # read whole (WHOLE): a text primary key
    ("key_pins", "pinned_at"),  # read whole: who is who on the mesh (bot.transports.mesh_keys)
)
# key not unique: one batch (small tables only)
WHOLE = {"outbox_parts", "outbox_packets", "shown_parts", "chat_settings", "key_pins"}
# Columns one store keeps for itself: PostgreSQL's search words (rebuilt from the row) and the
# outbox row's gateway (rows copied into PostgreSQL belong to the gateway that migrates them)
# and its claim (a copy is claimed by nobody: the process that held it is not the one reading).
DERIVED = {"search", "gateway", "claimed_by", "claimed_at"}
DEFERRED = {("conversations", "merged_into")}
BATCH = 2000


Progress = Callable[[str, int, int], None]  # table, rows done, rows in all tables


async def plan(source: Movable, dest: Movable) -> list[tuple[str, str, tuple[str, ...]]]:
    """(table, key, columns) to copy; refuses a destination that would lose data."""
    out = []
    for table, key in ORDER:
        have = await source.table_columns(table)
        if not have:
            continue
        can = await dest.table_columns(table)
        lost = [c for c in have if c not in can and c not in DERIVED]
        if lost:
            raise StorageError(
                f"the destination cannot hold {table}.{', '.join(lost)} (its schema is older or "
                "different). Fix: upgrade meshsage where the destination is used, or migrate "
                "into a store this version created."
            )
        cols = tuple(c for c in have if c not in DERIVED and (table, c) not in DEFERRED)
        out.append((table, key, cols))
    return out


async def copy_store(source: Movable, dest: Movable, *, progress: Progress) -> dict[str, int]:
    """Copy every table; return the verified row count per table."""
    if await dest.copy_unfinished():  # an earlier run was interrupted: start over
        await dest.empty_tables([t for t, _ in reversed(ORDER) if await dest.table_columns(t)])
    elif await dest.count_rows("conversations"):
        raise StorageError(
            "the destination store already holds conversations. Fix: migrate into an empty "
            "database (a new SQLite file, or a new PostgreSQL database)."
        )
    tables = await plan(source, dest)
    await dest.mark_copy(unfinished=True)
    counts = {table: await source.count_rows(table) for table, _, _ in tables}
    total = sum(counts.values())
    done = 0
    for table, key, columns in tables:
        after = -1
        limit = 1 << 31 if table in WHOLE else BATCH
        while True:
            rows = await source.export_rows(table, key, columns, after=after, limit=limit)
            if not rows:
                break
            await dest.import_rows(table, columns, rows)
            done += len(rows)
            progress(table, done, total)
            if table in WHOLE:
                break
            after = int(rows[-1][0])
        for dtable, column in DEFERRED:
            if dtable == table and column in await source.table_columns(table):
                await _copy_column(source, dest, table, key, column)
    await dest.finish_import()
    for table, want in counts.items():
        got = await dest.count_rows(table)
        if got != want:
            raise StorageError(
                f"copy incomplete: {table} has {got} rows in the destination, {want} in the "
                "source. Fix: check the destination's logs and run the same command again (it "
                "starts over)."
            )
    await dest.mark_copy(unfinished=False)
    return counts


async def _copy_column(source: Movable, dest: Movable, table: str, key: str, column: str) -> None:
    after = -1
    while rows := await source.export_rows(table, key, (key, column), after=after, limit=BATCH):
        await dest.update_rows(table, key, column, [r for r in rows if r[1] is not None])
        after = int(rows[-1][0])


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
