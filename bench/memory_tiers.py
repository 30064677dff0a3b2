"""Per-turn memory overhead with sessions and facts on, as the number of sessions grows (issue 12).

Run: ``python -m bench.memory_tiers [--messages 20000 --conversations 40 --turns 300
--active 20 --sessions 0,100,1000,10000]``.

A synthetic history (``bench.corpus``) is copied once per session count; every conversation
then gets that many closed, summarized sessions covering its history, a long-term summary and
20 facts (10 pinned, 10 extracted with provenance); the long-term summary covers the first
half of the history, so the window has moved past it and it is in every prompt. (With more
sessions than messages, the extra sessions share the last message; the reply path never lists
sessions either way.) The real app (``bench.pipeline.drive``: store, layered context,
retrieval, summarizer, session keeper, fact extraction, gate, responder) answers turns through
the real OpenAI adapter and the fake LLM on 127.0.0.1.
Overhead = turn time - LLM time, as in ``bench.pipeline``. The claim checked: the hot path reads
the long-term summary by key and never lists sessions, so the overhead must not grow with the
number of sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.corpus import generate_database
from bench.pipeline import DB_NAME, RunResult, drive, reply_maker
from bot.llm.tokens import make_counter

LONGTERM = (
    "Over many sessions the person talked about their LoRa radios, their garden, a trip to the "
    "mountains in June and their cat Miso; they prefer short answers and metric units. "
) * 3


def seed_tiers(db_path: Path, *, sessions: int) -> None:
    """Give every conversation ``sessions`` closed sessions, a long-term summary and facts."""
    tokens = make_counter().count(LONGTERM)
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        db.execute("BEGIN")
        convs = db.execute(
            "SELECT conversation_id, min(id), max(id), min(created_at), max(created_at) "
            "FROM messages GROUP BY conversation_id"
        ).fetchall()
        for cid, first, last, start, end in convs:
            span = max(1, (last - first + 1) // max(1, sessions))
            rows = []
            for i in range(sessions):
                lo = min(last, first + i * span)
                hi = last if i == sessions - 1 else min(last, lo + span - 1)
                summary = "They talked about radios and the garden. Plans were made."
                rows.append((cid, lo, hi, start, end, hi - lo + 1, f"Session {i}", summary, 12))
            db.executemany(
                "INSERT INTO sessions (conversation_id, first_message_id, last_message_id, "
                "started_at, ended_at, messages, title, summary, tokens) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            db.execute(
                "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions, "
                "up_to_message_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                (cid, LONGTERM, tokens, sessions, (first + last) // 2, end),
            )
            db.executemany(
                "INSERT INTO facts (conversation_id, text, tokens, created_at, pinned, "
                "source_ids, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        cid,
                        f"Fact number {i} about the person",
                        6,
                        end,
                        int(i < 10),
                        f"[{first + i}]",
                        end,
                    )
                    for i in range(20)
                ],
            )
        db.execute("COMMIT")
    finally:
        db.close()


async def run(source: Path, work: Path, args: argparse.Namespace) -> list[tuple[int, RunResult]]:
    from tests.fakes.fake_llm import FakeLLM

    fake = FakeLLM()
    fake.reply_fn = reply_maker(args.seed)
    await fake.start()
    results = []
    try:
        for n in args.sessions:
            state = work / f"sessions-{n}"
            state.mkdir()
            shutil.copyfile(source, state / DB_NAME)
            await asyncio.to_thread(seed_tiers, state / DB_NAME, sessions=n)
            result = await drive(
                state_dir=state,
                strategy="ours",
                base_url=fake.base_url,
                turns=args.turns,
                active=args.active,
                warmup=args.warmup,
                seed=args.seed,
            )
            results.append((n, result))
            shutil.rmtree(state)
    finally:
        await fake.stop()
    return results


def table(results: Sequence[tuple[int, RunResult]]) -> str:
    lines = [
        "| sessions per person | overhead p50 ms | overhead p99 ms | before LLM p50 ms | "
        "after LLM p50 ms | prompt chars |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in results:
        lines.append(
            f"| {n} | {r.overhead_p50_ms:.1f} | {r.overhead_p99_ms:.1f} | "
            f"{r.before_llm_p50_ms:.1f} | {r.after_llm_p50_ms:.1f} | {r.avg_prompt_chars:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.memory_tiers")
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--turns", type=int, default=300)
    p.add_argument("--active", type=int, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--sessions",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 100, 1000, 10_000],
        help="comma-separated session counts per person",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meshsage-tiers-") as tmp:
        work = Path(tmp)
        source = work / "source.db"
        generate_database(source, messages=args.messages, conversations=args.conversations,
                          seed=args.seed, quiet=True)  # fmt: skip
        results = asyncio.run(run(source, work, args))
    print(f"Command: `python -m bench.memory_tiers --messages {args.messages} --conversations "
          f"{args.conversations} --turns {args.turns} --active {args.active} --sessions "
          f"{','.join(map(str, args.sessions))}`\n")  # fmt: skip
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
