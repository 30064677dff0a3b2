"""End-to-end memory: is what a question needs in the prompt the bot actually sends?

    python -m bench.memory_e2e ../shared/bench/locomo-dev.json [--conversations 2]
        [--questions 40] [--variants restart,live] [--categories 1,2,3,4]

Protocol (issue 17). Each LoCoMo conversation is replayed through the real app
(``bot.app.build``: responder, layered context builder, summarizer, LLM gate, the real
OpenAI-compatible adapter over HTTP) to the fake LLM server on 127.0.0.1, as one person
talking with the bot, at the mesh profile (1,536-token budget, 120 completion tokens, the
Meshtastic style hint; ``bench.prefix.MeshLikeTransport``):
- speaker A's consecutive lines are one message from the person; the fake server answers it
  with speaker B's lines that follow (so the bot's stored answers are B's turns, and the log
  is the conversation, as in ``bench.recall``); a run of B lines with no A line before it is
  answered to a "Hi." message;
- background calls (summary chapters, merges) are answered by the fake with a ~50-word text
  built from the rare words of its input, never a verbatim sentence, so a summary can never
  count as holding an evidence turn; after each turn the benchmark waits for them.
Then each question (categories 1-4 by default) is asked:
- ``restart``: of a copy of the finished memory, by a freshly started app (what
  ``meshsage chat`` after a restart does; questions never become history);
- ``live``: in sequence, in the process that replayed the conversation (no restart; each
  question and its answer become history for the next).
The reply request the fake server received is read back, and scored: the share of the
question's evidence turns whose text appears anywhere in it (system, window, notes, final
message), and its size (cl100k tokens of the ChatML-rendered request). A message the bot sent
no reply request for is not a crash of the benchmark: what the person got instead (a notice)
and the app's warnings are printed, a question scores 0 and is counted ("no reply request"),
and a replayed line is simply missing from the log, as it would be for a user.

Printed: per variant, recall per category and for 1-4, prompt tokens (mean, of the budget),
questions, and seconds. ``--conversations``/``--questions`` keep a run short on a busy
machine (questions are taken evenly through each conversation's list). Nothing is timed for
a verdict; nothing from the LoCoMo data (CC BY-NC 4.0) is written into the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.prefix import (
    CONTEXT_TOKENS,
    STYLE_HINT,
    MeshLikeTransport,
    bench_config,
    replace_block,
)
from bench.recall import Dialogue, Question, load
from bot.app import App, build
from bot.domain import Inbound
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter, make_counter

ROOT = Path(__file__).resolve().parent.parent
MEMORY_DOC = ROOT / "docs" / "memory.md"
MARK_START = "<!-- bench:memory_e2e:start -->"
MARK_END = "<!-- bench:memory_e2e:end -->"
PERSON = "person"
VARIANTS = ("restart", "live")
_RARE = re.compile(r"[A-Za-z][A-Za-z'-]{5,}")


@dataclass(frozen=True, slots=True)
class Exchange:
    message: str  # what the person says (speaker A's lines)
    answer: str  # what the fake server answers (speaker B's lines that follow)


def exchanges(dlg: Dialogue) -> list[Exchange]:
    """The conversation as person/bot exchanges: A's run, then B's run."""
    out: list[Exchange] = []
    a: list[str] = []
    b: list[str] = []
    for turn in dlg.turns:
        if turn.speaker == dlg.speaker_a:
            if b:
                out.append(Exchange("\n".join(a) or "Hi.", "\n".join(b)))
                a, b = [], []
            a.append(turn.text)
        else:
            b.append(turn.text)
    if a or b:
        out.append(Exchange("\n".join(a) or "Hi.", "\n".join(b) or "I see."))
    return out


class Script:
    """The fake server's answers: the replayed B lines for replies, a word list for summaries."""

    def __init__(self) -> None:
        self.answer = "I see."

    def __call__(self, body: dict[str, Any]) -> str:
        system = str(body["messages"][0]["content"])
        if STYLE_HINT in system:  # a reply (background calls carry no transport hint)
            return self.answer
        words = sorted({w.lower() for w in _RARE.findall(str(body["messages"][-1]["content"]))})
        return "They talked about " + ", ".join(words[:45]) + "."


@dataclass
class Tally:
    recall: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    unanswered: list[str] = field(default_factory=list)  # questions with no reply request

    def add(self, category: int, score: float, tokens: int) -> None:
        self.recall[category].append(score)
        self.tokens.append(tokens)

    def miss(self, category: int, why: str) -> None:
        """A question the bot sent no reply request for: nothing reached the model (0)."""
        self.recall[category].append(0.0)
        self.unanswered.append(why)


def score(question: Question, body: dict[str, Any], text_of: dict[str, str]) -> float:
    sent = "\n".join(str(m["content"]) for m in body["messages"])
    return sum(text_of[e] in sent for e in question.evidence) / len(question.evidence)


def sent_tokens(body: dict[str, Any], counter: TokenCounter) -> int:
    """The request's size as the bot counts it against its budget (content + overheads)."""
    return sum(counter.count(str(m["content"])) + MESSAGE_OVERHEAD for m in body["messages"])


def pick(questions: Sequence[Question], categories: set[int], limit: int | None) -> list[Question]:
    chosen = [q for q in questions if q.category in categories]
    if limit is None or limit >= len(chosen):
        return chosen
    step = len(chosen) / limit
    return [chosen[int(i * step)] for i in range(limit)]


class Warnings(logging.Handler):
    """The app's warnings and errors while one message is handled (why it got no answer)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        self.records.append(f"{record.name}: {text}")


class Unanswered(Exception):
    """A message the bot sent no reply request for: what the person got, and the warnings."""


async def ask(app: App, transport: MeshLikeTransport, fake: Any, text: str, n: int) -> Any:
    """Send one message through the app; return the reply request the server received, or
    raise ``Unanswered`` saying what the person got instead and the app's warnings."""
    before = len(fake.requests)
    sent = len(transport.sent)
    warnings = Warnings()
    logging.getLogger("bot").addHandler(warnings)
    try:
        await _inject(app, transport, text, n)
    finally:
        logging.getLogger("bot").removeHandler(warnings)
    replies = [b for b in fake.requests[before:] if STYLE_HINT in str(b["messages"][0]["content"])]
    if len(replies) != 1:
        got = [f"{r.kind.value}: {r.text[:120]!r}" for r in transport.sent[sent:]]
        raise Unanswered(
            f"message {n}: {len(replies)} reply requests (expected one); the person got "
            f"{got or 'nothing'}; warnings: {warnings.records or 'none'}"
        )
    return replies[0]


async def _inject(app: App, transport: MeshLikeTransport, text: str, n: int) -> None:
    await transport.inject(
        Inbound(
            transport=transport.name,
            sender=PERSON,
            text=text,
            message_id=f"m{n}",
            sender_name=PERSON.title(),
        )
    )
    await app.responder.wait_idle()
    await app.summarizer.wait_quiet()


async def tally(
    into: Tally,
    q: Question,
    asked: Coroutine[Any, Any, Any],
    text_of: dict[str, str],
    counter: TokenCounter,
    log: Any,
) -> None:
    """Score the reply request ``asked`` returns, or count the question as unanswered."""
    try:
        body = await asked
    except Unanswered as exc:
        log(f"  {q.text[:40]!r}: {exc}")
        into.miss(q.category, str(exc))
        return
    into.add(q.category, score(q, body, text_of), sent_tokens(body, counter))


async def started(state: Path, base_url: str, share: float | None) -> tuple[App, MeshLikeTransport]:
    transport = MeshLikeTransport()
    config = bench_config(state, base_url, share=share)
    app = await build(config, env={}, transports=[transport])
    await app.start()
    return app, transport


async def run_dialogue(
    dlg: Dialogue,
    questions: Sequence[Question],
    *,
    variants: Sequence[str],
    counter: TokenCounter,
    tallies: dict[str, Tally],
    share: float | None = None,
    log: Any = print,
) -> None:
    from tests.fakes.fake_llm import FakeLLM

    fake = FakeLLM()
    script = Script()
    fake.reply_fn = script
    await fake.start()
    text_of = {t.dia_id: t.text for t in dlg.turns}
    try:
        with tempfile.TemporaryDirectory(prefix="meshsage-e2e-") as tmp:
            state = Path(tmp) / "state"
            app, transport = await started(state, fake.base_url, share)
            t0 = time.perf_counter()
            try:
                for n, ex in enumerate(exchanges(dlg)):
                    script.answer = ex.answer
                    try:
                        await ask(app, transport, fake, ex.message, n)
                    except Unanswered as exc:  # the log then lacks this answer, as for a user
                        log(f"  {dlg.sample_id}: replay {exc}")
                log(f"  {dlg.sample_id}: replayed in {time.perf_counter() - t0:.0f} s")
                snapshot = Path(tmp) / "snapshot.db"
                with (
                    sqlite3.connect(app.config.database_path) as src,
                    sqlite3.connect(snapshot) as dst,
                ):
                    src.backup(dst)
                if "live" in variants:
                    t0 = time.perf_counter()
                    script.answer = "I don't know."
                    for i, q in enumerate(questions):
                        asked = ask(app, transport, fake, q.text, 100_000 + i)
                        await tally(tallies["live"], q, asked, text_of, counter, log)
                    tallies["live"].seconds += time.perf_counter() - t0
            finally:
                await app.close()
            if "restart" in variants:
                t0 = time.perf_counter()
                script.answer = "I don't know."
                for i, q in enumerate(questions):
                    copy = Path(tmp) / f"copy{i}"
                    copy.mkdir()
                    shutil.copy(snapshot, copy / app.config.database_path.name)
                    app, transport = await started(copy, fake.base_url, share)
                    try:
                        asked = ask(app, transport, fake, q.text, 200_000 + i)
                        await tally(tallies["restart"], q, asked, text_of, counter, log)
                    finally:
                        await app.close()
                        shutil.rmtree(copy)
                tallies["restart"].seconds += time.perf_counter() - t0
    finally:
        await fake.stop()


def table(tallies: dict[str, Tally], categories: Sequence[int]) -> str:
    head = " | ".join(f"cat {c}" for c in categories)
    lines = [
        f"| variant | questions | {head} | all asked | prompt tokens mean (of {CONTEXT_TOKENS}) "
        "| min | max | no reply request | seconds |",
        "|---|---:|" + "---:|" * len(categories) + "---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in tallies.items():
        every = [s for c in categories for s in t.recall.get(c, [])]
        if not every:
            continue
        cells = " | ".join(
            f"{statistics.mean(t.recall[c]):.3f} ({len(t.recall[c])})" if t.recall.get(c) else "-"
            for c in categories
        )
        lines.append(
            f"| {name} | {len(every)} | {cells} | **{statistics.mean(every):.3f}** "
            f"| {statistics.mean(t.tokens or [0]):.0f} | {min(t.tokens, default=0)} "
            f"| {max(t.tokens, default=0)} "
            f"| {len(t.unanswered)} | {t.seconds:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.memory_e2e", description=__doc__.split("\n")[0]
    )
    p.add_argument("data", type=Path, help="LoCoMo-format JSON (../shared/bench/locomo-dev.json)")
    p.add_argument("--conversations", type=int, default=None, help="only the first N")
    p.add_argument(
        "--skip", type=int, default=0, help="leave out the first N (split a long run in parts)"
    )
    p.add_argument("--questions", type=int, default=None, help="at most N per conversation")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--categories", default="1,2,3,4")
    p.add_argument("--share", type=float, default=None, help="memory.retrieval.share")
    p.add_argument(
        "--write-docs", action="store_true", help="rewrite docs/memory.md's end-to-end table"
    )
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    categories = sorted(int(c) for c in args.categories.split(","))
    dialogues = load(args.data)[: args.conversations][args.skip :]
    counter = make_counter()
    tallies = {v: Tally() for v in variants}
    for dlg in dialogues:
        questions = pick(dlg.questions, set(categories), args.questions)
        print(f"{dlg.sample_id}: {len(dlg.turns)} turns, {len(questions)} questions", flush=True)
        asyncio.run(
            run_dialogue(
                dlg,
                questions,
                variants=variants,
                counter=counter,
                tallies=tallies,
                share=args.share,
            )
        )
        print(table(tallies, categories), flush=True)
    command = "python -m bench.memory_e2e " + " ".join(argv if argv is not None else [])
    print(f"\n{command.strip()}\n{len(dialogues)} conversation(s)\n")
    print(table(tallies, categories))
    if args.write_docs:
        names = ", ".join(d.sample_id for d in dialogues)
        write_docs(
            MEMORY_DOC, command.replace(" --write-docs", ""), names, table(tallies, categories)
        )
        print(f"wrote {MEMORY_DOC}")


def write_docs(path: Path, command: str, names: str, rendered: str) -> None:
    """Replace the table between the markers in ``path`` with this run's."""
    block = "\n".join(
        [
            f"Command: `{command.strip()}`. Date: {time.strftime('%Y-%m-%d')}. Conversations: "
            f"{names}. Recall = share of a question's evidence turns whose text is in the prompt "
            "sent (mean per category, question count in brackets); prompt tokens as the bot "
            "counts them; seconds are wall time on the machine that ran it (not a verdict).",
            "",
            rendered,
        ]
    )
    replace_block(path, MARK_START, MARK_END, block)


if __name__ == "__main__":
    main()
