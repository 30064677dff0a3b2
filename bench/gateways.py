"""Pipeline benchmark, SQLite against PostgreSQL: per-turn overhead and turns/s on the same
history, with 1..N gateway processes sharing one PostgreSQL database (issues 14, 19).
``python -m bench.pipeline --store postgresql://...`` runs it.

Steps:
0. SQLite first, on the same history and machine (``bench.pipeline``'s ``ours`` run: one
   process, a fresh copy of the generated file), unless ``--skip-sqlite``.
1. the synthetic history of ``bench.pipeline`` (same generator, same cache under
   ``bench/results/``), copied into the PostgreSQL database once with ``bot.memory.move`` (the
   code behind ``meshsage migrate-store``) and then VACUUM ANALYZEd, as autovacuum would do
   after such a load; a database already holding that history is reused.
2. one fake LLM process, answering at once over loopback HTTP, as in ``bench.pipeline``.
3. for each gateway count N: N processes, each the real app (``bot.app.build`` with
   ``storage.url`` set, so a ``PostgresStore`` with its pool and lock connection) driven by an
   in-process transport. The measured conversations are split between them (each gateway serves
   its own people, as sites do); every process runs its warm-up, then all start together.

Per turn, as in ``bench.pipeline``: overhead = turn time (inbound stored, turn lock taken,
context built, LLM answered, reply stored, sent, delivery recorded) minus the LLM call. Turns/s
is all gateways' measured turns divided by the wall time from the common start to the last
gateway's end. The PostgreSQL server, the fake LLM and every gateway share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.corpus import TRANSPORT, TextGen
from bench.pipeline import (
    RESULTS,
    ROOT,
    BenchTransport,
    TimingLLM,
    Turn,
    _child,
    _result_line,
    bench_config,
    cache_path,
    machine_notes,
    percentile,
    serve_turn,
)
from bot.app import build
from bot.config import StorageConfig
from bot.domain import Inbound
from bot.llm.openai_compat import OpenAICompatLLM
from bot.memory.move import bar, copy_store
from bot.memory.open import open_url
from bot.memory.postgres import PostgresStore
from bot.memory.sqlite import SqliteStore

MARK_START = "<!-- bench:gateways:start -->"
MARK_END = "<!-- bench:gateways:end -->"


@dataclass(frozen=True, slots=True)
class GatewayRun:
    gateways: int
    turns: int
    messages_in_db: int
    overhead_p50_ms: float
    overhead_p99_ms: float
    turns_per_s: float
    per_gateway_turns_per_s: float
    duplicate_sends: int = 0  # a reply sent twice within its turn (an outbox race), counted


# --- one gateway process ----------------------------------------------------------------------
async def serve_one(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, print READY, wait for a line on stdin, run this gateway's share of turns."""
    state = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    config = bench_config(state_dir=state, base_url=args.base_url, strategy="ours").model_copy(
        update={"storage": StorageConfig(url=args.store, password_env=args.password_env)}
    )
    real = OpenAICompatLLM(config=config.llm, env={})
    llm = TimingLLM(real)
    transport = BenchTransport(context_tokens=args.context_tokens)
    app = await build(config, env=os.environ, llm=llm, transports=[transport])
    rows = await app.store._all(  # the people of the generated history
        "SELECT person FROM conversations WHERE transport = $1 ORDER BY id", (TRANSPORT,)
    )
    people = random.Random(args.seed).sample([r[0] for r in rows], args.active + args.warmup)
    warm, mine = people[: args.warmup], people[args.warmup :][args.index :: args.of]
    gen = TextGen(seed=args.seed + args.index)
    rng = random.Random(args.seed + 100 + args.index)
    overheads: list[float] = []
    duplicates = [0]
    try:
        await app.start()
        count = 0

        async def one_turn(person: str) -> Turn:
            nonlocal count
            count += 1
            inbound = Inbound(
                transport=TRANSPORT,
                sender=person,
                text=gen.user_message(rng),
                message_id=f"gw{args.index}-{os.getpid()}-{count}",
                sender_name=f"Person {person}",
                authenticated=True,  # a known person (bot.trust)
            )
            turn, doubles = await serve_turn(app, transport, llm, inbound, count)
            duplicates[0] += doubles  # an outbox race: counted and reported
            return turn

        for i in range(args.warmup // args.of + 1):
            await one_turn(warm[(i * args.of + args.index) % len(warm)])
        print("READY", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        started = time.time()
        for i in range(args.turns // args.of):
            overheads.append((await one_turn(mine[i % len(mine)])).overhead)
        ended = time.time()
    finally:
        await app.close()
        await real.close()
    return {"overheads": overheads, "started": started, "ended": ended, "duplicates": duplicates[0]}


# --- orchestration ----------------------------------------------------------------------------
def _password_env(args: argparse.Namespace) -> str | None:
    return args.password_env if os.environ.get(args.password_env) is not None else None


async def load(args: argparse.Namespace, db: Path) -> int:
    """Copy the generated history into the PostgreSQL database unless it is there already;
    return the number of messages it holds."""
    pg = await open_url(args.store, password_env=_password_env(args), env=os.environ)
    try:
        have = await pg.count_rows("conversations")
        if have == 0:
            print(f"loading {db.name} into PostgreSQL (once) ...", flush=True)
            source = await SqliteStore.open(db)
            try:
                t0 = time.perf_counter()
                await copy_store(source, pg, progress=bar(sys.stdout.write))
                print(f"loaded in {time.perf_counter() - t0:.0f} s", flush=True)
            finally:
                await source.close()
            # Statistics and the visibility map (index-only word lookups skip the heap only on
            # all-visible pages), as autovacuum sets them some time after a bulk load.
            assert isinstance(pg, PostgresStore), "--store must be a postgresql:// URL"
            await pg._run(lambda con: con.execute("VACUUM ANALYZE"))
        elif have != args.conversations:
            raise SystemExit(
                f"{args.store} holds {have} conversations, not the {args.conversations} of this "
                "history. Fix: point --store at an empty database."
            )
        # An interrupted earlier run may have left questions pending: a gateway starting now
        # would answer them (recovery) inside the measured turns. They are not part of this run.
        await pg._all("UPDATE messages SET status = 'failed' WHERE status = 'pending'")
        return await pg.count_rows("messages")
    finally:
        await pg.close()


def run_gateways(args: argparse.Namespace, base_url: str, n: int, messages: int) -> GatewayRun:
    extra = ["--store", args.store, "--password-env", args.password_env, "--base-url", base_url]
    procs = [
        subprocess.Popen(
            [*_child(args, "gw-serve", *extra), "--index", str(i), "--of", str(n)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        for p in procs:  # every gateway warmed up before any measured turn
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"gateway did not get ready: {line!r}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("GO\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=3600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError("a gateway process failed")
    parts = [_result_line(out, "GATEWAY") for out in outputs]
    overheads = [o for part in parts for o in part["overheads"]]
    wall = max(p["ended"] for p in parts) - min(p["started"] for p in parts)
    return GatewayRun(
        gateways=n,
        turns=len(overheads),
        messages_in_db=messages,
        overhead_p50_ms=1000 * percentile(overheads, 50),
        overhead_p99_ms=1000 * percentile(overheads, 99),
        turns_per_s=len(overheads) / wall,
        per_gateway_turns_per_s=len(overheads) / wall / n,
        duplicate_sends=sum(int(p.get("duplicates", 0)) for p in parts),
    )


def run_all(args: argparse.Namespace, counts: str | None = None) -> list[GatewayRun]:
    """The PostgreSQL runs for ``counts`` gateway processes (default ``--gateways``)."""
    db = cache_path(args)
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        partial = db.with_name(db.name + ".partial")
        for leftover in (partial, *(Path(f"{partial}{x}") for x in ("-wal", "-shm"))):
            leftover.unlink(missing_ok=True)
        print(f"database: generating {db} ...", flush=True)
        subprocess.run(_child(args, "generate", "--db", str(partial)), cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        partial.rename(db)
    messages = asyncio.run(load(args, db))
    fake = subprocess.Popen(
        _child(args, "fake-llm"), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert fake.stdout is not None
        first = fake.stdout.readline().split()
        base_url = f"http://127.0.0.1:{first[1]}/v1"
        runs = []
        for n in (int(x) for x in (counts or args.gateways).split(",")):
            print(f"{n} gateway(s): {args.turns} turns ...", flush=True)
            try:
                runs.append(run_gateways(args, base_url, n, messages))
            except RuntimeError as exc:  # said, and the other counts still measured
                print(f"{n} gateway(s) FAILED: {exc}", flush=True)
                continue
            print("RUN " + json.dumps(asdict(runs[-1])), flush=True)
        return runs
    finally:
        if fake.stdin is not None:
            fake.stdin.close()
        fake.wait(timeout=10)


def sqlite_row(args: argparse.Namespace) -> GatewayRun | None:
    """SQLite's ``ours`` run of ``bench.pipeline`` on the same history (one process)."""
    if args.skip_sqlite:
        return None
    from bench import pipeline

    ours = argparse.Namespace(**{**vars(args), "strategies": "ours"})
    print(f"SQLite: {args.turns} turns ...", flush=True)
    (r,) = pipeline.run_all(ours)
    print("SQLITE " + json.dumps(asdict(r)), flush=True)
    return GatewayRun(
        gateways=1,
        turns=r.turns,
        messages_in_db=r.messages_in_db,
        overhead_p50_ms=r.overhead_p50_ms,
        overhead_p99_ms=r.overhead_p99_ms,
        turns_per_s=r.turns_per_s,
        per_gateway_turns_per_s=r.turns_per_s,
        duplicate_sends=r.duplicate_sends,
    )


def table(
    runs: Sequence[GatewayRun],
    sqlite: GatewayRun | None = None,
    rounds: Sequence[tuple[GatewayRun, GatewayRun]] = (),
) -> str:
    lines = [
        "| store | gateway processes | overhead p50 ms | overhead p99 ms | turns/s (all) "
        "| turns/s per gateway | messages in DB | duplicate sends |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [("SQLite", sqlite)] if sqlite is not None else []
    for store, r in [*rows, *(("PostgreSQL", r) for r in runs)]:
        assert r is not None
        lines.append(
            f"| {store} | {r.gateways} | {r.overhead_p50_ms:.2f} | {r.overhead_p99_ms:.2f} | "
            f"{r.turns_per_s:.0f} | {r.per_gateway_turns_per_s:.0f} | {r.messages_in_db:,} | "
            f"{r.duplicate_sends} |"
        )
    one = next((r for r in runs if r.gateways == 1), None)
    if sqlite is not None and one is not None:
        which = "in the last round" if len(rounds) > 1 else ""
        lines += [
            "",
            f"PostgreSQL (1 gateway) / SQLite{' ' + which if which else ''}: overhead p50 "
            f"{one.overhead_p50_ms / sqlite.overhead_p50_ms:.2f}x, p99 "
            f"{one.overhead_p99_ms / sqlite.overhead_p99_ms:.2f}x (target: p50 within 1.5x).",
        ]
    if len(rounds) > 1:
        ratios = [pg.overhead_p50_ms / sq.overhead_p50_ms for sq, pg in rounds]
        each = ", ".join(
            f"{sq.overhead_p50_ms:.2f} / {pg.overhead_p50_ms:.2f} ms = {r:.2f}x"
            for (sq, pg), r in zip(rounds, ratios, strict=True)
        )
        lines += [
            "",
            f"{len(rounds)} rounds, SQLite then 1 PostgreSQL gateway each (overhead p50): "
            f"{each}. **Median ratio {statistics.median(ratios):.2f}x** (the table shows the "
            "last round).",
        ]
    return "\n".join(lines)


def command_line(args: argparse.Namespace) -> str:
    return (
        f"python -m bench.pipeline --store postgresql://... --messages {args.messages} "
        f"--conversations {args.conversations} --turns {args.turns} --active {args.active} "
        f"--gateways {args.gateways}"
        + (f" --rounds {args.rounds}" if getattr(args, "rounds", 1) > 1 else "")
    )


def write_docs(
    path: Path, args: argparse.Namespace, runs: Sequence[GatewayRun], sqlite: GatewayRun | None
) -> None:
    measured = table(runs, sqlite, getattr(args, "rounds_measured", ()))
    block = "\n".join([
        MARK_START,
        f"Command: `{command_line(args)}` (warm-up {args.warmup} turns, seed {args.seed}); "
        f"PostgreSQL {args.server_version} on a unix socket, same machine.",
        "",
        f"Machine: {machine_notes()}. Date: {time.strftime('%Y-%m-%d')}. 1-minute load "
        f"average {args.load[0]:.1f} at the start, {args.load[1]:.1f} at the end (other work "
        "shares this machine: compare runs only at similar load).",
        "",
        measured,
        MARK_END,
    ])  # fmt: skip
    _replace(path, MARK_START, MARK_END, block)


def _replace(path: Path, start: str, end: str, block: str) -> None:
    text = path.read_text() if path.exists() else ""
    if start not in text:
        raise SystemExit(f"{path} has no {start} marker; add one where the table goes")
    head, rest = text.split(start, 1)
    path.write_text(head + block + rest.split(end, 1)[1])


async def _server_version(args: argparse.Namespace) -> str:
    pg = await open_url(args.store, password_env=_password_env(args), env=os.environ)
    try:
        rows = await pg._all("SHOW server_version")
        return str(rows[0][0]).split()[0]
    finally:
        await pg.close()


def main(args: argparse.Namespace) -> None:
    if args.step == "gw-serve":
        print("GATEWAY " + json.dumps(asyncio.run(serve_one(args))))
        return
    load_before = os.getloadavg()[0]
    # Every round adds the same turns to both stores (same seed, same people, same messages),
    # so SQLite keeps its copy from round to round as PostgreSQL keeps its database: round i
    # compares the two on the same history.
    args.reuse_work = args.rounds > 1
    rounds: list[tuple[GatewayRun, GatewayRun]] = []
    for i in range(1, args.rounds):  # the earlier rounds: SQLite, then 1 gateway
        print(f"round {i} of {args.rounds}", flush=True)
        sq, pg = sqlite_row(args), run_all(args, "1")
        if sq is not None and pg:
            rounds.append((sq, pg[0]))
    sqlite = sqlite_row(args)
    runs = run_all(args)
    one = next((r for r in runs if r.gateways == 1), None)
    if rounds and sqlite is not None and one is not None:
        rounds.append((sqlite, one))
    args.load = (load_before, os.getloadavg()[0])
    args.rounds_measured = rounds
    if args.reuse_work and not args.keep:
        shutil.rmtree(RESULTS / "work-ours", ignore_errors=True)
    print()
    print(table(runs, sqlite, rounds))
    print(f"\nmachine: {machine_notes()}")
    if args.write_docs:
        args.server_version = asyncio.run(_server_version(args))
        write_docs(Path(args.headline), args, runs, sqlite)
        print(f"wrote the table into {args.headline}")
    print(
        json.dumps({"sqlite": sqlite and asdict(sqlite), "postgresql": [asdict(r) for r in runs]})
    )
