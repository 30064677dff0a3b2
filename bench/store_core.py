"""What the store core's query layer costs per statement (issue 19 point 1).

For each backend, times the same point read three ways, interleaved in rounds so a noisy
machine hurts them alike:

- raw: the driver directly (aiosqlite ``execute_fetchall`` under the store lock; asyncpg
  ``fetchval`` with ``$1`` on a pooled connection), as the store did before the core;
- core: ``store._val`` with the ``?`` string the core writes (PostgreSQL rewrites it once,
  then a dict lookup);
- tx: the same read through ``store._atomic()`` and ``Tx.val`` (a transaction per read).

It prints the median microseconds per statement of each and writes nothing. PostgreSQL runs
on the tests' throwaway server (tests/pg_server.py) and is skipped, saying why, without one.
Usage: python -m bench.store_core [--reads 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bot.domain import ConversationKey
from bot.memory.store import SqliteStore

SQL = "SELECT reset_after FROM conversations WHERE id = ?"


async def _time(n: int, read: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await read()
    return (time.perf_counter() - start) / n * 1e6


async def _tx_read(store: Any, cid: int) -> Any:
    async with store._atomic() as tx:
        return await tx.val(SQL, (cid,))


async def measure(name: str, store: Any, raw: Callable[[int], Awaitable[Any]], args: Any) -> None:
    cid = (await store.conversation(ConversationKey("mesh", "!0000bench"))).id
    ways: dict[str, Callable[[], Awaitable[Any]]] = {
        "raw": lambda: raw(cid),
        "core": lambda: store._val(SQL, (cid,)),
        "tx": lambda: _tx_read(store, cid),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.rounds):
        for key, read in ways.items():
            times[key].append(await _time(args.reads, read))
    cells = "  ".join(f"{k} {statistics.median(v):7.1f} µs" for k, v in times.items())
    print(f"{name:9} {cells}  (median of {args.rounds} rounds of {args.reads} reads)")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sq = await SqliteStore.open(Path(tmp) / "bench.db")

        async def sq_raw(cid: int) -> Any:
            async with sq._lock:
                return list(await sq._db.execute_fetchall(SQL, (cid,)))

        try:
            await measure("sqlite", sq, sq_raw, args)
        finally:
            await sq.close()
    try:
        from tests import pg_server

        pg = await pg_server.open_store()
    except Exception as exc:  # a bench reports and goes on
        print(f"postgres  skipped: {exc}")
        return
    numbered = SQL.replace("?", "$1")

    async def pg_raw(cid: int) -> Any:
        async with pg._pool.acquire() as con:
            return await con.fetchval(numbered, cid)

    try:
        await measure("postgres", pg, pg_raw, args)
    finally:
        await pg.close()
        pg_server.stop_shared()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
