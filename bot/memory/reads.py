"""Independent store reads made at once.

A prompt needs several reads that depend on nothing else read (the chapters, the facts, the
late answers, a reply's chain, the sessions). Made one after the other, each costs a round
trip; made at once, a PostgreSQL store runs them in parallel on its pooled connections, so
they cost about one. A SQLite store queues them on its one connection in the same order, as
before.

Invariants:
- Only reads go here: no write's outcome depends on the order of the others.
- Every read has ended (finished or cancelled) when ``at_once`` exits: the first error cancels
  the rest and leaves as itself, not as an ``ExceptionGroup``, so callers catch
  ``StorageError`` / ``sqlite3.Error`` as they would for one read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def at_once() -> AsyncIterator[asyncio.TaskGroup]:
    """``async with at_once() as reads: x = reads.create_task(store.read(...))``; the
    results are ready (``x.result()``) after the block."""
    try:
        async with asyncio.TaskGroup() as group:
            yield group
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
