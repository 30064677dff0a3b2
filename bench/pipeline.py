"""Pipeline benchmark: the bot's per-turn memory cost on a large database (issue 2).

Run: ``python -m bench.pipeline [--messages 1000000 --conversations 10000 --turns 2000
--active 200 --db PATH --keep]``. With ``--store postgresql://...`` it measures SQLite and then
gateway processes sharing that database, on the same history (``bench.gateways``).

Steps, each in its own process so that one step's memory does not show in another's peak RSS:
1. generate: a synthetic history (``bench.corpus``) through the real migrations, cached under
   ``bench/results/`` keyed by its parameters (reruns skip it).
2. fake-llm: the fake OpenAI-compatible server (``tests/fakes/fake_llm.py``) on 127.0.0.1,
   answering at once with generated text, in a process of its own like a real LLM server.
3. serve, once per strategy, on a fresh copy of the database: the real app (``bot.app.build``:
   store, context builder, retrieval, summarizer, LLM gate, responder) with the real
   ``OpenAICompatLLM`` talking HTTP to the fake, driven through an in-process transport.
   ``naive`` swaps in ``bench.naive.NaiveContextBuilder`` and turns summaries off.

What is measured, per turn, one turn at a time (round-robin over the active conversations):
- turn time: from ``responder.handle(inbound)`` to ``responder.wait_idle()`` returning, i.e. the
  inbound stored, context built, LLM answered, reply stored, sent and its delivery recorded;
- LLM time: the foreground ``complete`` call of the real adapter, timed by a wrapper placed
  between the LLM gate and the adapter (HTTP round trip, JSON, the fake's work);
- memory overhead = turn time - LLM time: storing, context assembly and persisting, plus the
  event-loop and aiosqlite-thread hops between them. Background summary calls are counted but
  not subtracted: whatever they cost the next turn is overhead too.
Turns/s is turns divided by the wall time of the measured loop (LLM calls included). Peak RSS is
the serving process's ``ru_maxrss``; generation runs in another process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from bench.corpus import BOT_NAME, GENERATOR_VERSION, TRANSPORT, TextGen, generate_database
from bench.naive import NaiveContextBuilder
from bot.app import App, build
from bot.config import (
    BotConfig,
    Config,
    LLMConfig,
    MemoryConfig,
    RateLimit,
    SummaryConfig,
)
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply, TransportLimits
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import LLM, ChatMessage, Completion, JsonSchema, OnText
from bot.memory.chapter_text import CHAPTER_PROMPT, CONTINUATION_MARK, MERGE_PROMPT
from bot.memory.context import ContextBuilder
from bot.memory.facts import PROMPT as FACTS_PROMPT
from bot.memory.layers import LayeredContext
from bot.memory.sessions import LONGTERM_PROMPT, SESSION_PROMPT
from bot.transports.base import OnMessage

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "pipeline.md"
HEADLINE = ROOT / "docs" / "benchmarks.md"
STRATEGIES = ("ours", "naive")
CONTEXT_TOKENS = 2048  # the default transport budget (console); Discord's is 4096, mesh 1536
MAX_TOKENS = 400
REPLY_MAX_CHARS = 2000
DB_NAME = "meshsage.db"  # Config.database_path's file name inside state_dir
MARK_START = "<!-- bench:pipeline:start -->"
MARK_END = "<!-- bench:pipeline:end -->"
# Background work (summary chapters and merges, session summaries, long-term summary, fact
# extraction) is told apart from replies by its system prompt: this wrapper sits below the
# gate's lanes.
_BACKGROUND_PREFIXES = tuple(
    p.split("{", 1)[0][:60]
    for p in (CHAPTER_PROMPT, MERGE_PROMPT, SESSION_PROMPT, LONGTERM_PROMPT, FACTS_PROMPT)
)


# --- the in-process transport and the timing LLM wrapper ------------------------------------
class BenchTransport:
    """Transport twin: ``inject`` plays an inbound message; ``send`` records and succeeds."""

    name = TRANSPORT

    def __init__(self, *, context_tokens: int) -> None:
        self.limits = TransportLimits(
            context_tokens=context_tokens,
            max_tokens=MAX_TOKENS,
            style_hint="Answer in a few short paragraphs at most.",
        )
        self.sent: list[Reply] = []
        self._on_message: OnMessage | None = None
        self._closed = asyncio.Event()

    def fit(self, text: str) -> str:
        return text[:REPLY_MAX_CHARS]

    @contextlib.asynccontextmanager
    async def working(self, inbound: Inbound) -> AsyncIterator[None]:
        yield

    async def start(self, on_message: OnMessage) -> None:
        self._on_message = on_message

    async def send(self, reply: Reply) -> Delivery:
        self.sent.append(reply)
        return Delivery(DeliveryStatus.SENT, message_ids=(f"bench-{len(self.sent)}",))

    async def stop(self) -> None:
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def inject(self, inbound: Inbound) -> None:
        assert self._on_message is not None, "start() first"
        await self._on_message(inbound)


@dataclass
class TimingLLM:
    """Wraps the real adapter; records when each foreground (reply) call ran."""

    inner: LLM
    foreground: list[tuple[float, float]] = field(default_factory=list)
    background_calls: int = 0
    prompt_chars: int = 0

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
        model: str | None = None,
    ) -> Completion:
        started = time.perf_counter()
        background = bool(messages) and (
            messages[0].content.startswith(_BACKGROUND_PREFIXES)
            or messages[-1].content.startswith(CONTINUATION_MARK)  # a fold continuing a reply
        )
        try:
            completion = await self.inner.complete(
                messages, max_tokens=max_tokens, on_text=on_text, schema=schema, model=model
            )
        finally:
            if not background:
                self.foreground.append((started, time.perf_counter()))
                self.prompt_chars += sum(len(m.content) for m in messages)
        if background:  # answered: a call cut at the stop or preempted is not counted
            self.background_calls += 1
        return completion


async def serve_turn(
    app: App, transport: BenchTransport, llm: TimingLLM, inbound: Inbound, n: int
) -> tuple[Turn, int]:
    """Inject one message, wait until the app is idle, and time the turn; with the number of
    extra copies of its reply (an outbox race: counted, not hidden). Raises unless the turn
    made exactly one LLM call and sent one reply (or copies of one)."""
    llm.foreground.clear()
    sent = len(transport.sent)
    t0 = time.perf_counter()
    await transport.inject(inbound)
    await app.responder.wait_idle()
    t1 = time.perf_counter()
    new = transport.sent[sent:]
    if len(llm.foreground) == 1 and len(new) > 1 and {r.text for r in new} == {new[0].text}:
        doubles = len(new) - 1
    elif len(llm.foreground) != 1 or len(new) != 1:
        raise RuntimeError(
            f"turn {n} did not produce exactly one LLM call and one reply "
            f"({len(llm.foreground)} calls, {len(new)} replies: "
            f"{[r.text[:80] for r in new]}; message {inbound.text[:80]!r})"
        )
    else:
        doubles = 0
    a, b = llm.foreground[0]
    return Turn(total=t1 - t0, llm=b - a, before_llm=a - t0, after_llm=t1 - b), doubles


# --- one serving run ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Turn:
    total: float
    llm: float
    before_llm: float
    after_llm: float

    @property
    def overhead(self) -> float:
        return self.total - self.llm


@dataclass(frozen=True, slots=True)
class RunResult:
    strategy: str
    turns: int
    warmup: int
    messages_in_db: int
    overhead_p50_ms: float
    overhead_p99_ms: float
    overhead_max_ms: float
    before_llm_p50_ms: float
    before_llm_p99_ms: float
    after_llm_p50_ms: float
    after_llm_p99_ms: float
    llm_p50_ms: float
    turns_per_s: float
    peak_rss_mb: float
    start_rss_mb: float
    replies_sent: int
    replies_persisted: int
    questions_answered: int
    summaries_refreshed: int
    avg_prompt_chars: float
    duplicate_sends: int = 0  # the same reply sent again within its turn (an outbox race)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def bench_config(*, state_dir: Path, base_url: str, strategy: str) -> Config:
    return Config(
        state_dir=state_dir,
        llm=LLMConfig(base_url=base_url, model="fake", api_key_env=None, retries=0),
        # Limits are per person and minutes long; a benchmark replays hours of traffic quickly.
        bot=BotConfig(rate_limit=RateLimit(messages=10_000, per_seconds=1.0), queue_limit=100),
        memory=MemoryConfig(summary=SummaryConfig(enabled=strategy == "ours")),
    )


def use_context(app: App, context: NaiveContextBuilder) -> None:
    """Wire an alternative context builder into a built app (the responder holds it)."""
    layered = app.context  # the one the answerer's FittingAsk builds prompts with
    fit: Any = app.responder.parts.answerer._fit
    assert isinstance(layered, LayeredContext) and fit._context is layered, (
        "the answerer no longer builds its prompts from app.context; update bench.pipeline"
    )
    layered.inner = cast(ContextBuilder, context)


def pick_people(db_path: Path, *, count: int, seed: int) -> tuple[list[str], int]:
    """``count`` distinct people with a conversation (uniformly at random), and max message id."""
    db = sqlite3.connect(db_path)
    try:
        people = [r[0] for r in db.execute("SELECT person FROM conversations ORDER BY id")]
        max_id = db.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]
    finally:
        db.close()
    if count > len(people):
        raise SystemExit(f"asked for {count} conversations; the database has {len(people)}")
    return random.Random(seed).sample(people, count), int(max_id)


def rss_mb(peak: bool) -> float:
    if peak:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def drive(
    *,
    state_dir: Path,
    strategy: str,
    base_url: str,
    turns: int,
    active: int,
    warmup: int,
    seed: int,
    context_tokens: int = CONTEXT_TOKENS,
) -> RunResult:
    """Serve ``turns`` turns (after ``warmup`` unmeasured ones) on ``state_dir/meshsage.db``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}")
    db_path = state_dir / DB_NAME
    people, max_id_before = pick_people(db_path, count=active + warmup, seed=seed)
    warm_people, people = people[:warmup], people[warmup:]
    gen = TextGen(seed=seed)
    rng = random.Random(seed + 100)
    config = bench_config(state_dir=state_dir, base_url=base_url, strategy=strategy)
    real = OpenAICompatLLM(config=config.llm, env={})
    llm = TimingLLM(real)
    transport = BenchTransport(context_tokens=context_tokens)
    app = await build(config, env={}, llm=llm, transports=[transport])
    timings: list[Turn] = []
    try:
        if strategy == "naive":
            use_context(
                app,
                NaiveContextBuilder(
                    store=app.store, counter=app.counter, system_prompt=config.bot.system_prompt
                ),
            )
        await app.start()
        counter = 0
        duplicates = 0

        async def one_turn(person: str) -> Turn:
            nonlocal counter, duplicates
            counter += 1
            inbound = Inbound(
                transport=TRANSPORT,
                sender=person,
                text=gen.user_message(rng),
                message_id=f"in-{os.getpid()}-{counter}",  # unique in a reused database too
                sender_name=f"Person {person}",
                authenticated=True,  # a known person (bot.trust)
            )
            turn, doubles = await serve_turn(app, transport, llm, inbound, counter)
            duplicates += doubles  # counted and reported, not hidden (see RunResult)
            return turn

        for i in range(warmup):
            await one_turn(warm_people[i % len(warm_people)])
        background_before = llm.background_calls
        chars_before = llm.prompt_chars
        start_rss = rss_mb(peak=False)
        loop_start = time.perf_counter()
        for i in range(turns):
            timings.append(await one_turn(people[i % len(people)]))
        elapsed = time.perf_counter() - loop_start
        summaries = llm.background_calls - background_before
        prompt_chars = llm.prompt_chars - chars_before
    finally:
        await app.close()
        await real.close()
    peak = rss_mb(peak=True)
    persisted, answered = _count_persisted(db_path, after_id=max_id_before)
    return RunResult(
        strategy=strategy,
        turns=len(timings),
        warmup=warmup,
        messages_in_db=max_id_before,
        overhead_p50_ms=1000 * percentile([t.overhead for t in timings], 50),
        overhead_p99_ms=1000 * percentile([t.overhead for t in timings], 99),
        overhead_max_ms=1000 * max(t.overhead for t in timings),
        before_llm_p50_ms=1000 * percentile([t.before_llm for t in timings], 50),
        before_llm_p99_ms=1000 * percentile([t.before_llm for t in timings], 99),
        after_llm_p50_ms=1000 * percentile([t.after_llm for t in timings], 50),
        after_llm_p99_ms=1000 * percentile([t.after_llm for t in timings], 99),
        llm_p50_ms=1000 * percentile([t.llm for t in timings], 50),
        turns_per_s=len(timings) / elapsed,
        peak_rss_mb=peak,
        start_rss_mb=start_rss,
        replies_sent=len(transport.sent),
        replies_persisted=persisted,
        questions_answered=answered,
        summaries_refreshed=summaries,
        avg_prompt_chars=prompt_chars / max(1, len(timings)),
        duplicate_sends=duplicates,
    )


def _count_persisted(db_path: Path, *, after_id: int) -> tuple[int, int]:
    """(assistant replies stored as sent, user messages marked answered) added by the run."""
    db = sqlite3.connect(db_path)
    try:
        rows = dict(
            db.execute(
                "SELECT role, count(*) FROM messages WHERE id > ? AND "
                "((role = 'assistant' AND status = 'sent' AND author = ?) OR "
                " (role = 'user' AND status = 'answered')) GROUP BY role",
                (after_id, BOT_NAME),
            ).fetchall()
        )
    finally:
        db.close()
    return int(rows.get("assistant", 0)), int(rows.get("user", 0))


# --- the fake LLM process -------------------------------------------------------------------
def reply_maker(seed: int) -> Any:
    gen = TextGen(seed=seed)
    rng = random.Random(seed + 200)
    return lambda _body: gen.assistant_message(rng)


async def serve_fake_llm(seed: int) -> None:
    """Run the fake until stdin closes; the first stdout line is ``PORT <n>``."""
    from tests.fakes.fake_llm import FakeLLM

    fake = FakeLLM()
    fake.reply_fn = reply_maker(seed)
    await fake.start()
    print(f"PORT {fake.port}", flush=True)
    try:
        await asyncio.to_thread(sys.stdin.read)
    finally:
        await fake.stop()


# --- orchestration --------------------------------------------------------------------------
def cache_path(args: argparse.Namespace) -> Path:
    if args.db:
        return Path(args.db)
    name = f"pipeline-m{args.messages}-c{args.conversations}-s{args.seed}-v{GENERATOR_VERSION}.db"
    return RESULTS / name


def _child(args: argparse.Namespace, step: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.pipeline",
        "--step",
        step,
        "--messages",
        str(args.messages),
        "--conversations",
        str(args.conversations),
        "--turns",
        str(args.turns),
        "--active",
        str(args.active),
        "--warmup",
        str(args.warmup),
        "--seed",
        str(args.seed),
        "--context-tokens",
        str(args.context_tokens),
        *extra,
    ]


def _result_line(output: str, tag: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(tag + " "):
            data: dict[str, Any] = json.loads(line[len(tag) + 1 :])
            return data
    raise RuntimeError(f"child printed no {tag} line:\n{output}")


def run_all(args: argparse.Namespace) -> list[RunResult]:
    db = cache_path(args)
    if db.exists():
        print(f"database: {db} (cached; delete it to regenerate)")
    else:
        db.parent.mkdir(parents=True, exist_ok=True)
        print(f"database: generating {db} ...", flush=True)
        partial = db.with_name(db.name + ".partial")
        for leftover in (partial, *(Path(f"{partial}{x}") for x in ("-wal", "-shm"))):
            leftover.unlink(missing_ok=True)
        proc = subprocess.run(
            _child(args, "generate", "--db", str(partial)),
            cwd=ROOT,
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        gen = _result_line(proc.stdout, "GENERATED")
        partial.rename(db)  # only a finished database is ever cached
        print(
            f"generated {gen['messages']:,} messages, {gen['conversations']:,} conversations, "
            f"{gen['summaries']:,} summaries, {gen['facts']:,} facts in {gen['seconds']:.1f} s "
            f"({gen['file_bytes'] / 2**20:.0f} MiB)"
        )
    fake = subprocess.Popen(
        _child(args, "fake-llm"), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    results: list[RunResult] = []
    try:
        assert fake.stdout is not None
        first = fake.stdout.readline().split()
        if first[:1] != ["PORT"]:
            raise RuntimeError(f"fake LLM did not start: {first}")
        base_url = f"http://127.0.0.1:{first[1]}/v1"
        reuse = getattr(args, "reuse_work", False)  # rounds: the same database grows on
        for strategy in args.strategies.split(","):
            work = RESULTS / f"work-{strategy}"
            if not (reuse and (work / DB_NAME).exists()):
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                shutil.copyfile(db, work / DB_NAME)
            print(f"serving {args.turns} turns with strategy {strategy} ...", flush=True)
            proc = subprocess.run(
                _child(
                    args,
                    "serve",
                    "--strategy",
                    strategy,
                    "--state-dir",
                    str(work),
                    "--base-url",
                    base_url,
                ),
                cwd=ROOT,
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            results.append(RunResult(**_result_line(proc.stdout, "RESULT")))
            if not args.keep and not reuse:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        if fake.stdin is not None:
            fake.stdin.close()
        try:
            fake.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fake.kill()
    return results


def table(results: Sequence[RunResult]) -> str:
    lines = [
        "| strategy | overhead p50 ms | overhead p99 ms | turns/s | peak RSS MB | messages in DB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.strategy} | {r.overhead_p50_ms:.2f} | {r.overhead_p99_ms:.2f} | "
            f"{r.turns_per_s:.0f} | {r.peak_rss_mb:.0f} | {r.messages_in_db:,} |"
        )
    return "\n".join(lines)


def detail_table(results: Sequence[RunResult]) -> str:
    lines = [
        "| strategy | before LLM p50/p99 ms | after LLM p50/p99 ms | overhead max ms "
        "| LLM call p50 ms | RSS at start MB | avg prompt chars | summaries refreshed "
        "| replies sent/persisted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.strategy} | {r.before_llm_p50_ms:.2f} / {r.before_llm_p99_ms:.2f} | "
            f"{r.after_llm_p50_ms:.2f} / {r.after_llm_p99_ms:.2f} | {r.overhead_max_ms:.1f} | "
            f"{r.llm_p50_ms:.2f} | {r.start_rss_mb:.0f} | {r.avg_prompt_chars:.0f} | "
            f"{r.summaries_refreshed} | {r.replies_sent}/{r.replies_persisted} |"
        )
    return "\n".join(lines)


def machine_notes() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        mem = f", {int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    return (
        f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )


def command_line(args: argparse.Namespace) -> str:
    return (
        f"python -m bench.pipeline --messages {args.messages} --conversations "
        f"{args.conversations} --turns {args.turns} --active {args.active}"
    )


def write_docs(
    path: Path, args: argparse.Namespace, results: Sequence[RunResult], *, detail: bool = True
) -> None:
    """Replace the generated section of ``path`` (between markers), keeping the rest.
    ``detail=False`` writes the headline table only (docs/benchmarks.md, Performance)."""
    block = "\n".join(
        [
            MARK_START,
            f"Command: `{command_line(args)}` (warm-up {args.warmup} turns, seed {args.seed}, "
            f"context budget {args.context_tokens} tokens)",
            "",
            f"Machine: {machine_notes()}. Date: {time.strftime('%Y-%m-%d')}.",
            "",
            table(results),
            *(["", detail_table(results)] if detail else []),
            MARK_END,
        ]
    )
    if path.exists() and MARK_START in (text := path.read_text()):
        head, rest = text.split(MARK_START, 1)
        tail = rest.split(MARK_END, 1)[1] if MARK_END in rest else ""
        new = head + block + tail
    else:
        new = "# Pipeline benchmark\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--conversations", type=int, default=10_000)
    p.add_argument("--turns", type=int, default=2000, help="measured turns per strategy")
    p.add_argument("--active", type=int, default=200, help="conversations the turns go to")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured turns first (other people)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--context-tokens", type=int, default=CONTEXT_TOKENS)
    p.add_argument("--db", help="generated database file (default: cached in bench/results/)")
    p.add_argument("--keep", action="store_true", help="keep the per-strategy working copies")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument(
        "--write-docs",
        action="store_true",
        help="publish the tables into --docs and --headline (only from a full run: the default "
        "sizes and every strategy); without it nothing is written",
    )
    p.add_argument("--docs", default=str(DOCS), help="Markdown file --write-docs updates")
    p.add_argument(
        "--headline",
        default=str(HEADLINE),
        help="Markdown file whose headline table (and, with --store, gateways table) "
        "--write-docs updates",
    )
    p.add_argument(
        "--store",
        help="postgresql://user@host/db: measure SQLite, then 1..N gateway processes on it, "
        "on the same history (bench.gateways)",
    )
    p.add_argument("--gateways", default="1,2,4", help="with --store: gateway process counts")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --store: measure SQLite and 1 PostgreSQL gateway this many times, "
        "alternately, and report each round's p50 ratio and their median (a shared machine's "
        "load drifts; alternating rounds see the same drift); the other gateway counts run "
        "once, in the last round",
    )
    p.add_argument("--password-env", default="MESHSAGE_PG_PASSWORD", help="with --store")
    p.add_argument(
        "--skip-sqlite", action="store_true", help="with --store: PostgreSQL only (no SQLite row)"
    )
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--of", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--step", default="all", help=argparse.SUPPRESS)
    p.add_argument("--strategy", help=argparse.SUPPRESS)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for s in args.strategies.split(","):
        if s not in STRATEGIES:
            p.error(f"unknown strategy {s!r}; choose from {', '.join(STRATEGIES)}")
    if args.write_docs and args.step == "all":
        partial = not_full_run(args, p)
        if partial:
            p.error(
                "--write-docs publishes the documented figures, so it needs a full run; "
                f"these options differ from it: {', '.join(partial)}. "
                "Fix: drop them, or drop --write-docs."
            )
    return args


FULL_RUN_KEYS = ("messages", "conversations", "turns", "active", "warmup", "seed",
                 "context_tokens", "strategies")  # fmt: skip


def not_full_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The options of ``args`` that make it smaller or different from the published run."""
    return [
        "--" + key.replace("_", "-")
        for key in FULL_RUN_KEYS
        if getattr(args, key) != parser.get_default(key)
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.store is not None and args.step in ("all", "gw-serve"):
        from bench import gateways  # PostgreSQL: several gateway processes on one database

        gateways.main(args)
        return
    if args.step == "generate":
        stats = generate_database(
            Path(args.db), messages=args.messages, conversations=args.conversations, seed=args.seed
        )
        print("GENERATED " + json.dumps(asdict(stats)))
    elif args.step == "fake-llm":
        asyncio.run(serve_fake_llm(args.seed))
    elif args.step == "serve":
        result = asyncio.run(
            drive(
                state_dir=Path(args.state_dir),
                strategy=args.strategy,
                base_url=args.base_url,
                turns=args.turns,
                active=args.active,
                warmup=args.warmup,
                seed=args.seed,
                context_tokens=args.context_tokens,
            )
        )
        print("RESULT " + json.dumps(asdict(result)))
    else:
        results = run_all(args)
        print()
        print(table(results))
        print()
        print(detail_table(results))
        print()
        print(f"machine: {machine_notes()}")
        print(
            "overhead = turn time (handle() until the reply is stored, sent and its delivery "
            "recorded) minus the foreground LLM call; see the module docstring."
        )
        if not args.write_docs:
            print("docs not changed (pass --write-docs on a full run to publish these tables)")
            return
        if args.docs:
            write_docs(Path(args.docs), args, results)
            print(f"wrote {args.docs}")
        if args.headline:
            write_docs(Path(args.headline), args, results, detail=False)
            print(f"wrote {args.headline}")


if __name__ == "__main__":
    main()
