"""What the store core's query layer costs per statement (issue 19 point 1).

For each backend, times the same point read three ways, interleaved in rounds so a noisy
machine hurts them alike:

- raw: the driver directly (aiosqlite ``execute_fetchall`` under the store lock; asyncpg
  ``fetchval`` with ``$1`` on a pooled connection), as the store did before the core;
- core: ``store._val`` with the ``?`` string the core writes (PostgreSQL rewrites it once,
  then a dict lookup);
- tx: the same read through ``store._atomic()`` and ``Tx.val`` (a transaction per read).

Then (``--turns N``, 0 to skip) it times the store calls of one turn, through the port only:
get the conversation, store the person's message (with a platform id: the heard check),
read the recent window, look two words up, read the outline, queue the answer with the
outbox row (claimed), record its part and finish it; N turns over 20 people, after ten
unmeasured turns each. It prints the median and 90th percentile of a whole turn's store time
and the median of each call.

It prints microseconds and writes nothing. PostgreSQL runs on the tests' throwaway server
(tests/pg_server.py) and is skipped, saying why, without one.
Usage: python -m bench.store_core [--reads 2000] [--rounds 5] [--turns 500]
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
from bot.memory.records import OutboxEntry, StoredAnswer
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


WORDS = ["radio", "battery", "antenna", "relay", "weather", "trail", "river", "summit",
         "valley", "camp", "signal"]  # fmt: skip
PEOPLE = 20


async def _one_turn(store: Any, n: int, calls: dict[str, list[float]]) -> float:
    """One turn's store calls; the whole turn in µs, each call's µs appended to ``calls``."""
    key = ConversationKey("mesh", f"!bench{n % PEOPLE:04d}")
    words = " ".join(WORDS[(n + i) % len(WORDS)] for i in range(6))
    start = last = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        calls.setdefault(name, []).append((now - last) * 1e6)
        last = now

    conv = await store.conversation(key)
    lap("conversation")
    mid = await store.add_message(conv.id, role="user", author="ann", text=f"about {words}?",
                                  tokens=8, status="pending", platform_id=f"pkt-{n}")  # fmt: skip
    lap("add_message")
    await store.recent_messages(conv, limit=20, before_id=mid)
    lap("recent_messages")
    await store.search_terms(conv.id, WORDS[n % 5 : n % 5 + 2], after_id=0, before_id=mid)
    lap("search_terms")
    await store.outline(conv.id, after_id=0, before_id=mid)
    lap("outline")
    answer = StoredAnswer(conv.id, "bot", f"an answer on {words}", 9)
    entry = OutboxEntry(key, "answer", f"an answer on {words}", reply_to=f"pkt-{n}",
                        question_id=mid)  # fmt: skip
    row = await store.queue_delivery(entry, answer=answer, claim=True)
    lap("queue_delivery")
    await store.record_part(row, 0, f"out-{n}")
    lap("record_part")
    await store.finish_delivery(row, "sent")
    lap("finish_delivery")
    return (last - start) * 1e6


async def turns(name: str, store: Any, args: argparse.Namespace) -> None:
    for n in range(PEOPLE * 10):  # a history first, unmeasured: ten turns per person
        await _one_turn(store, -1 - n, {})
    calls: dict[str, list[float]] = {}
    whole = sorted([await _one_turn(store, n, calls) for n in range(args.turns)])
    print(
        f"{name:9} turn p50 {statistics.median(whole):8.1f} µs  p90 "
        f"{whole[int(len(whole) * 0.9)]:8.1f} µs  ({args.turns} turns); p50 per call:"
    )
    print("          " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in calls.items()))


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sq = await SqliteStore.open(Path(tmp) / "bench.db")

        async def sq_raw(cid: int) -> Any:
            async with sq._lock:
                return list(await sq._db.execute_fetchall(SQL, (cid,)))

        try:
            await measure("sqlite", sq, sq_raw, args)
            if args.turns:
                await turns("sqlite", sq, args)
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
        if args.turns:
            await turns("postgres", pg, args)
    finally:
        await pg.close()
        pg_server.stop_shared()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=500, help="turns timed (0: none)")
    asyncio.run(main(parser.parse_args()))
