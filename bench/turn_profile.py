"""Where a turn's store time goes: every store call and every database round trip, per turn
(issue 19 point 2).

Serves turns through the real app exactly as ``bench.pipeline`` does (``bot.app.build``, the
real ``OpenAICompatLLM`` over HTTP to the fake LLM, the in-process transport), on SQLite or on
PostgreSQL (``--store``), and counts, per measured turn:

- each public store call (``conversation``, ``add_message``, ``queue_delivery``, ...): how
  many, and its wall time (outermost calls only; a call made by another store call counts
  inside it), split by who made it: the turn's worker (``turn``) or a background task
  (``background``: summaries, sessions, the indexer);
- each database round trip: on SQLite a hop to aiosqlite's thread (``execute``,
  ``execute_fetchall``, ``executemany``, BEGIN/COMMIT included), on PostgreSQL a message
  exchange with the server (asyncpg ``execute``/``fetch*``/``executemany``, BEGIN/COMMIT
  included, and the advisory-lock queries on the lock connection), with its statement.

It prints a table per store call and per statement (first 90 characters) and writes nothing.
Not a timed benchmark: the wall times are this machine's, under whatever load it has; the
counts are exact.

Usage: python -m bench.turn_profile --db COPY.db [--store postgresql://...] [--turns 200]
[--active 100] [--warmup 20]
With ``--store`` the PostgreSQL database must already hold the same history (``bench.pipeline
--store`` loads it); ``--db`` is then read only for the people to talk to.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import inspect
import os
import random
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.corpus import TRANSPORT, TextGen
from bench.pipeline import BenchTransport, TimingLLM, bench_config, pick_people
from bot.app import build
from bot.config import StorageConfig
from bot.domain import Inbound
from bot.llm.openai_compat import OpenAICompatLLM

_depth: contextvars.ContextVar[int] = contextvars.ContextVar("store_depth", default=0)
_who: contextvars.ContextVar[str] = contextvars.ContextVar("store_who", default="background")


class Recorder:
    def __init__(self) -> None:
        self.on = False
        self.calls: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.trips: dict[tuple[str, str], list[float]] = defaultdict(list)

    @staticmethod
    def who() -> str:
        """``turn`` in a turn's worker task and in the tasks it starts for reads made at once
        (``bot.memory.reads``: they copy the worker's context, where this marks it)."""
        task = asyncio.current_task()
        name = task.get_name() if task is not None else ""
        if name.startswith("turns ") or name == "main":
            _who.set("turn")
            return "turn"
        coro = task.get_coro() if task is not None else None
        if getattr(getattr(coro, "cr_code", None), "co_name", "") == "timed":
            return _who.get()  # a task that is one store call: a read made at once
        return "background"

    def call(self, name: str, seconds: float) -> None:
        if self.on:
            self.calls[(self.who(), name)].append(seconds)

    def trip(self, sql: str, seconds: float) -> None:
        if self.on:
            self.trips[(self.who(), " ".join(str(sql).split())[:90])].append(seconds)


REC = Recorder()


def _wrap_store(cls: type) -> None:
    for name, fn in inspect.getmembers(cls, inspect.iscoroutinefunction):
        if name.startswith("_"):
            continue

        def make(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            async def timed(*args: Any, **kwargs: Any) -> Any:
                depth = _depth.get()
                token = _depth.set(depth + 1)
                t0 = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    _depth.reset(token)
                    if depth == 0:
                        REC.call(name, time.perf_counter() - t0)

            return timed

        setattr(cls, name, make(name, fn))


def _wrap_trips(cls: type, methods: tuple[str, ...], sql_of: Callable[..., str]) -> None:
    for name in methods:
        fn = getattr(cls, name)

        def make(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await fn(self, *args, **kwargs)
                finally:
                    REC.trip(sql_of(name, args), time.perf_counter() - t0)

            return timed

        setattr(cls, name, make(name, fn))


def instrument(store_cls: type, postgres: bool) -> None:
    _wrap_store(store_cls)
    if postgres:
        import asyncpg
        from asyncpg.connection import Connection

        # fetch/fetchrow/fetchval/execute-with-args all go through _execute; execute without
        # args (BEGIN, COMMIT) is a simple query; executemany is one pipelined exchange.
        orig_execute = Connection.execute

        @functools.wraps(orig_execute)
        async def execute(self: Any, query: str, *args: Any, timeout: Any = None) -> Any:
            if args:
                return await orig_execute(self, query, *args, timeout=timeout)
            t0 = time.perf_counter()
            try:
                return await orig_execute(self, query, timeout=timeout)
            finally:
                REC.trip(query, time.perf_counter() - t0)

        Connection.execute = execute  # type: ignore[method-assign]
        _wrap_trips(Connection, ("_execute", "_executemany"), lambda n, a: a[0])
        assert asyncpg
    else:
        import aiosqlite

        # Every hop to the connection's thread (statements, cursor fetches) is one _execute.
        _wrap_trips(
            aiosqlite.Connection,
            ("_execute",),
            lambda n, a: a[1] if len(a) > 1 and isinstance(a[1], str) else "cursor fetch",
        )


def report(turns: int) -> None:
    def table(title: str, data: dict[tuple[str, str], list[float]]) -> None:
        print(f"\n{title} (per measured turn; ms)")
        print(f"{'who':<10} {'per turn':>8} {'p50':>7} {'mean':>7} {'ms/turn':>8}  name")
        total: dict[str, tuple[float, float]] = {}
        for (who, name), values in sorted(data.items(), key=lambda kv: -sum(kv[1])):
            n, ms = len(values) / turns, sum(values) * 1000 / turns
            c, t = total.get(who, (0.0, 0.0))
            total[who] = (c + n, t + ms)
            print(
                f"{who:<10} {n:>8.2f} {statistics.median(values) * 1000:>7.2f} "
                f"{statistics.fmean(values) * 1000:>7.2f} {ms:>8.2f}  {name}"
            )
        for who, (n, ms) in sorted(total.items()):
            print(f"{who:<10} {n:>8.2f} {'':>7} {'':>7} {ms:>8.2f}  (all)")

    table("store calls", REC.calls)
    table("round trips", REC.trips)


async def run(args: argparse.Namespace, base_url: str) -> None:
    postgres = args.store is not None
    me = asyncio.current_task()
    assert me is not None
    me.set_name("main")  # handle() runs here: the turn's intake
    state = Path(tempfile.mkdtemp(prefix="bench-prof-"))
    if postgres:
        from bot.memory.postgres import PostgresStore

        instrument(PostgresStore, True)
    else:
        from bot.memory.sqlite import SqliteStore

        instrument(SqliteStore, False)
        shutil.copyfile(args.db, state / "meshsage.db")
    people, _ = pick_people(Path(args.db), count=args.active + args.warmup, seed=args.seed)
    warm, people = people[: args.warmup], people[args.warmup :]
    config = bench_config(state_dir=state, base_url=base_url, strategy="ours")
    if postgres:
        config = config.model_copy(
            update={"storage": StorageConfig(url=args.store, password_env=args.password_env)}
        )
    real = OpenAICompatLLM(config=config.llm, env={})
    llm = TimingLLM(real)
    transport = BenchTransport(context_tokens=2048)
    app = await build(config, env=os.environ, llm=llm, transports=[transport])
    gen, rng = TextGen(seed=args.seed), random.Random(args.seed + 100)
    overheads: list[float] = []
    try:
        await app.start()
        for i in range(args.warmup + args.turns):
            person = warm[i % len(warm)] if i < args.warmup else people[i % len(people)]
            REC.on = i >= args.warmup
            llm.foreground.clear()
            t0 = time.perf_counter()
            await transport.inject(
                Inbound(transport=TRANSPORT, sender=person, text=gen.user_message(rng),
                        message_id=f"prof-{os.getpid()}-{i}", sender_name=f"Person {person}",
                        authenticated=True)
            )  # fmt: skip
            await app.responder.wait_idle()
            t1 = time.perf_counter()
            if REC.on:
                a, b = llm.foreground[0]
                overheads.append(t1 - t0 - (b - a))
        REC.on = False
    finally:
        await app.close()
        await real.close()
    o = sorted(overheads)
    print(
        f"{'PostgreSQL' if postgres else 'SQLite'}: {len(o)} turns, overhead p50 "
        f"{o[len(o) // 2] * 1000:.2f} ms, p90 {o[int(len(o) * 0.9)] * 1000:.2f} ms, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    report(len(o))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.turn_profile", description=__doc__)
    p.add_argument("--db", required=True, help="a generated history (bench.pipeline's cache)")
    p.add_argument("--store", help="postgresql://... holding the same history")
    p.add_argument("--password-env", default="MESHSAGE_PG_PASSWORD")
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--active", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    from bench.pipeline import reply_maker
    from tests.fakes.fake_llm import FakeLLM

    async def go() -> None:
        fake = FakeLLM()
        fake.reply_fn = reply_maker(args.seed)
        await fake.start()
        try:
            await run(args, f"http://127.0.0.1:{fake.port}/v1")
        finally:
            await fake.stop()

    asyncio.run(go())


if __name__ == "__main__":
    main()
