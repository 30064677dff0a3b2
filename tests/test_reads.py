"""``bot.memory.reads.at_once``: reads made at once end together, and an error leaves as the
one a single read would raise (callers catch ``StorageError`` / ``sqlite3.Error``), not as an
``ExceptionGroup``."""

from __future__ import annotations

import asyncio

import pytest

from bot.errors import StorageError
from bot.memory.reads import at_once


async def test_results_are_ready_after_the_block_and_the_reads_overlapped() -> None:
    started: list[str] = []
    both = asyncio.Event()

    async def read(name: str) -> str:
        started.append(name)
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), timeout=5)  # each waits until the other began
        return name.upper()

    async with at_once() as reads:
        a = reads.create_task(read("a"))
        b = reads.create_task(read("b"))
    assert (a.result(), b.result()) == ("A", "B")


async def test_the_first_error_leaves_as_itself_and_the_other_reads_are_cancelled() -> None:
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def broken() -> None:
        raise StorageError("cannot reach PostgreSQL. Fix: check that the server runs")

    with pytest.raises(StorageError, match="cannot reach"):
        async with at_once() as reads:
            reads.create_task(slow())
            reads.create_task(broken())
    assert cancelled.is_set()
