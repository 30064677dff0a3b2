"""Vector search timing: ``SqliteStore.vector_search`` on a 6,000-message conversation.

Run: ``python -m bench.vector_search [--messages 6000 --others 4 --dims 384 768 --queries 500]``.

A fresh SQLite file gets ``--others + 1`` conversations of ``--messages`` messages each, every
message with a random unit vector (the real ``add_vectors``, in batches as the indexer writes
them). Then, per dimension:
- cold: the first search of the conversation (reads its vectors from SQLite, builds the
  cached matrix);
- warm: ``--queries`` searches over the whole history with a random query and a random id
  range (``after_id`` = a reset mark, ``before_id`` = the recent window), p50/p99/max;
- append: one new turn's two vectors added (the cache is extended in place), then a search;
- uncached: a search after another connection wrote (``PRAGMA data_version`` changed), which
  drops the cache and reloads: the worst case, e.g. while ``meshsage memory reindex`` runs.
Other people's conversations are there to show that they cost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from bot.domain import ConversationKey
from bot.memory.store import SqliteStore

BATCH = 32


async def _fill(
    store: SqliteStore, *, person: str, messages: int, dim: int, rng: np.random.Generator,
    model: str,
) -> int:  # fmt: skip
    conv = await store.conversation(ConversationKey("bench", person))
    await store.add_messages(
        conv.id, [("user", person, f"message {i}", 3, 1.7e9 + i) for i in range(messages)]
    )
    todo = await store.messages_missing_vectors(model, limit=messages, conversation_id=conv.id)
    vecs = rng.standard_normal((len(todo), dim)).astype(np.float32)
    for start in range(0, len(todo), BATCH):
        chunk = todo[start : start + BATCH]
        await store.add_vectors(
            [(m.id, conv.id, model, vecs[start + i].tolist()) for i, m in enumerate(chunk)]
        )
    return conv.id


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


async def _bench(dim: int, args: argparse.Namespace, tmp: Path) -> list[str]:
    rng = np.random.default_rng(dim)
    model = f"bench-{dim}"
    path = tmp / f"v{dim}.db"
    store = await SqliteStore.open(path)
    try:
        t0 = time.perf_counter()
        for k in range(args.others):
            await _fill(store, person=f"other{k}", messages=args.messages, dim=dim, rng=rng,
                        model=model)  # fmt: skip
        cid = await _fill(store, person="me", messages=args.messages, dim=dim, rng=rng,
                          model=model)  # fmt: skip
        fill = time.perf_counter() - t0
        ids = [m.id for m in await store.all_messages(cid)]
        lo_id, hi_id = ids[0], ids[-1]

        def query() -> list[float]:
            q: list[float] = rng.standard_normal(dim).astype(np.float32).tolist()
            return q

        t = time.perf_counter()
        await store.vector_search(cid, query(), model=model, after_id=0, before_id=hi_id + 1,
                                  limit=40)  # fmt: skip
        cold = time.perf_counter() - t

        warm: list[float] = []
        for _ in range(args.queries):
            after = int(rng.integers(lo_id - 1, lo_id + len(ids) // 10))
            before = int(rng.integers(hi_id - 40, hi_id + 1))
            q = query()
            t = time.perf_counter()
            hits = await store.vector_search(cid, q, model=model, after_id=after,
                                             before_id=before, limit=40)  # fmt: skip
            warm.append(time.perf_counter() - t)
            assert len(hits) == 40
        warm.sort()

        conv = await store.conversation(ConversationKey("bench", "me"))
        new = [
            await store.add_message(
                conv.id, role=r, author="me", text="new", tokens=1, status="answered"
            )
            for r in ("user", "assistant")
        ]
        t = time.perf_counter()
        await store.add_vectors([(mid, cid, model, query()) for mid in new])
        t_add = time.perf_counter() - t
        t = time.perf_counter()
        hits = await store.vector_search(cid, query(), model=model, after_id=0,
                                         before_id=new[-1] + 1, limit=40)  # fmt: skip
        t_after = time.perf_counter() - t

        with sqlite3.connect(path) as other:  # another process writes something
            other.execute(
                "UPDATE conversations SET created_at = created_at + 1 WHERE id = ?", (cid,)
            )
        t = time.perf_counter()
        await store.vector_search(cid, query(), model=model, after_id=0, before_id=hi_id + 1,
                                  limit=40)  # fmt: skip
        uncached = time.perf_counter() - t
    finally:
        await store.close()
    n = len(warm)
    return [
        f"| {dim} | {args.messages:,} (+{args.others} x {args.messages:,} others) | {fill:.1f} s "
        f"| {_ms(cold)} | {_ms(warm[n // 2])} | {_ms(warm[min(n - 1, int(n * 0.99))])} "
        f"| {_ms(warm[-1])} | {_ms(t_add)} / {_ms(t_after)} | {_ms(uncached)} |"
    ]


async def _main(args: argparse.Namespace) -> None:
    print(f"# vector_search on {platform.machine()}, {platform.python_version()}, "
          f"numpy {np.__version__}; times in ms (fill in s)\n")  # fmt: skip
    print("| dim | messages in the conversation | fill | cold (load) | warm p50 | warm p99 "
          "| warm max | append 2 + search | after another writer |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for dim in args.dims:
            for line in await _bench(dim, args, Path(tmp)):
                print(line, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=6000)
    p.add_argument("--others", type=int, default=4)
    p.add_argument("--dims", type=int, nargs="+", default=[384, 768])
    p.add_argument("--queries", type=int, default=500)
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()
