"""End-to-end memory: is what a question needs in the prompt the bot actually sends?

    python -m bench.memory_e2e ../shared/bench/locomo-dev.json [--conversations 2]
        [--questions 40] [--variants restart,live] [--categories 1,2,3,4] [--no-dated]
        [--sessions 5] [--memory-url http://127.0.0.1:8177/v1 --memory-model NAME]
        [--digest-memory]

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
  count as holding an evidence turn; after each turn the benchmark waits for them;
- at the conversation's own dates (issue 29; ``--no-dated``: now): each message is received
  at its recorded time and the app's wall clock (``build(wall=...)``: answers' dates,
  ``{date}``, session closing) reads the replay's clock. The session keeper's loop is
  stopped; when more than ``memory.session_gap`` passes between two exchanges the bench runs
  the keeper's own ``tick`` at the moment the session went idle, until nothing is left to
  close or summarize (sessions, their facts, the long-term summary), and once more after the
  last exchange; the questions are asked at that time. An exchange never spans two sessions.
  Dates that go backwards or repeat are replayed as recorded (the app invents no session);
- ``--memory-url``: every background call goes to that server (a real model writes the
  chapters, summaries and facts; ``Split``), replies still to the fake. ``--digest-memory``:
  the same run with every model-written text replaced by the app's own fallback (``Digest``
  answers each background call with nothing worth keeping: every chapter, session title and
  summary is the extractive digest, the facts only the person's plain statements), the
  baseline a real model's memory must not fall below (issue 37).
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

Printed: per variant, recall per category and for 1-4, the share of temporal questions
whose evidence days are written in the prompt, the evidence words shown, prompts with an
older session's summary and with the long-term summary (``bench.e2e_score``), prompt tokens
(mean, of the budget), questions, seconds; then what the memory held. ``--conversations``,
``--questions`` and ``--sessions`` keep a run short on a busy machine (questions are taken
evenly through each conversation's list). Nothing is timed for
a verdict; nothing from the LoCoMo data (CC BY-NC 4.0) is written into the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.e2e_score import (
    TEMPORAL,
    Kept,
    Tally,
    dated,
    first_sessions,
    invented,
    kept_line,
    pick,
    said_words,
    score,
    sent_tokens,
    session_of,
    table,
    words_shown,
)
from bench.prefix import (
    TRANSPORT,
    MeshLikeTransport,
    bench_config,
    is_reply,
    replace_block,
)
from bench.recall import Dialogue, Question, Turn, load
from bot.app import App, build
from bot.config import LLMConfig
from bot.domain import ConversationKey, Inbound
from bot.errors import LLMUnavailable
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import LLM, ChatMessage, Completion
from bot.llm.tokens import TokenCounter, make_counter
from bot.memory.facts import PROMPT as FACTS_PROMPT
from bot.memory.layers import LONGTERM_HEADER
from bot.memory.older_chapter import CHAPTER_HEADER
from bot.memory.store import Conversation

ROOT = Path(__file__).resolve().parent.parent
MEMORY_DOC = ROOT / "docs" / "memory.md"
MARK_START = "<!-- bench:memory_e2e:start -->"
MARK_END = "<!-- bench:memory_e2e:end -->"
REAL_START = "<!-- bench:memory_e2e_real:start -->"  # a run whose memory a real model wrote
REAL_END = "<!-- bench:memory_e2e_real:end -->"
PERSON = "person"
VARIANTS = ("restart", "live")
_RARE = re.compile(r"[A-Za-z][A-Za-z'-]{5,}")
UPKEEP_ROUNDS = 50  # ticks per pause at most (each closes or summarizes a few sessions)


@dataclass(frozen=True, slots=True)
class Exchange:
    message: str  # what the person says (speaker A's lines)
    answer: str  # what the fake server answers (speaker B's lines that follow)
    at: float = 0.0  # recorded time of the message (its first line; B's first if none)
    answer_at: float = 0.0  # recorded time of the answer (B's first line; ``at`` if none)


def exchanges(dlg: Dialogue) -> list[Exchange]:
    """The conversation as person/bot exchanges: A's run, then B's run, at their recorded
    times (the run's first line). An exchange never spans two sessions: a session that opens
    with B's lines opens with a "Hi." from the person."""
    out: list[Exchange] = []
    a: list[Turn] = []
    b: list[Turn] = []

    def close() -> None:
        first = (a or b)[0].created_at
        out.append(
            Exchange(
                "\n".join(t.text for t in a) or "Hi.",
                "\n".join(t.text for t in b) or "I see.",
                at=first,
                answer_at=b[0].created_at if b else first,
            )
        )

    for turn in dlg.turns:
        if (a or b) and session_of(turn) != session_of((a or b)[0]):  # never across sessions
            close()
            a, b = [], []
        if turn.speaker == dlg.speaker_a:
            if b:
                close()
                a, b = [], []
            a.append(turn)
        else:
            b.append(turn)
    if a or b:
        close()
    return out


class Script:
    """The fake server's answers: the replayed B lines for replies, a word list for summaries."""

    def __init__(self) -> None:
        self.answer = "I see."

    def __call__(self, body: dict[str, Any]) -> str:
        if is_reply(body):  # (a fold sent as a reply's continuation ends with its task)
            return self.answer
        words = sorted({w.lower() for w in _RARE.findall(str(body["messages"][-1]["content"]))})
        return "They talked about " + ", ".join(words[:45]) + "."


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


class ReplayClock:
    """The app's wall clock in a dated replay: the bench sets ``now`` to each line's recorded
    time (backwards too, when the recorded dates go backwards, as a clock without RTC does)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Split:
    """An LLM port for the real-model runs: replies (requests with the transport's hint) go to
    the fake server, which answers them with the replayed lines; every background call
    (chapters, session and long-term summaries, fact extraction) goes to the real model."""

    def __init__(self, *, replies: LLM, memory: LLM) -> None:
        self._replies = replies
        self._memory = memory
        self.calls = 0
        self.failed = 0

    @property
    def model_name(self) -> str:
        return self._memory.model_name

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, **kwargs: Any
    ) -> Completion:
        if messages and is_reply({"messages": [{"content": m.content} for m in messages]}):
            return await self._replies.complete(messages, max_tokens=max_tokens, **kwargs)
        self.calls += 1
        try:
            return await self._memory.complete(messages, max_tokens=max_tokens, **kwargs)
        except LLMUnavailable:
            self.failed += 1
            raise


class Digest:
    """The memory "model" of ``--digest-memory``: it writes nothing a check keeps, so every
    chapter, session and long-term summary is the app's extractive digest, a title the
    person's own words, and the facts only their plain statements."""

    model_name = "digest"

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, **kwargs: Any
    ) -> Completion:
        system = messages[0].content if messages else ""
        if system.startswith(FACTS_PROMPT[:40]):
            return Completion('{"facts": []}', self.model_name)
        return Completion("(none)", self.model_name)


async def ask(
    app: App,
    transport: MeshLikeTransport,
    fake: Any,
    text: str,
    n: int,
    at: float | None = None,
    *,
    settle: bool = True,
) -> Any:
    """Send one message through the app (received at ``at``, a recorded time, if given);
    return the reply request the server received, or raise ``Unanswered`` saying what the
    person got instead and the app's warnings. ``settle``: wait for the background work the
    message started (a fold's chapter); an app closed right after (a restart question) need
    not, and closing cancels it."""
    before = len(fake.requests)
    sent = len(transport.sent)
    warnings = Warnings()
    logging.getLogger("bot").addHandler(warnings)
    try:
        await _inject(app, transport, text, n, at, settle=settle)
    finally:
        logging.getLogger("bot").removeHandler(warnings)
    replies = [b for b in fake.requests[before:] if is_reply(b)]
    if len(replies) != 1:
        got = [f"{r.kind.value}: {r.text[:120]!r}" for r in transport.sent[sent:]]
        raise Unanswered(
            f"message {n}: {len(replies)} reply requests (expected one); the person got "
            f"{got or 'nothing'}; warnings: {warnings.records or 'none'}"
        )
    return replies[0]


async def _inject(
    app: App, transport: MeshLikeTransport, text: str, n: int, at: float | None, *, settle: bool
) -> None:
    inbound = Inbound(
        transport=transport.name,
        sender=PERSON,
        text=text,
        message_id=f"m{n}",
        sender_name=PERSON.title(),
        authenticated=True,  # the person whose memory is measured (bot.trust)
    )
    if at is not None:
        inbound = replace(inbound, received_at=datetime.fromtimestamp(at, UTC))
    await transport.inject(inbound)
    await app.responder.wait_idle()
    if settle:
        await app.summarizer.wait_quiet()


async def upkeep(app: App, log: Any = print) -> int:
    """What the app's session loop does while the person is away (the bench drives its
    ``tick`` so a replay is deterministic): close idle sessions, summarize them (title and
    summary, facts, the long-term summary), until a round does nothing. Returns the sessions
    summarized."""
    assert app.sessions is not None
    done = 0
    for _ in range(UPKEEP_ROUNDS):
        try:
            report = await app.sessions.tick()
        except LLMUnavailable as exc:  # as the loop does: postponed, retried at the next tick
            log(f"  session upkeep postponed: {exc}")
            return done
        await app.summarizer.wait_quiet()
        done += report.summarized
        if not (report.closed or report.summarized):
            break
    return done


async def replay(
    app: App,
    transport: MeshLikeTransport,
    fake: Any,
    script: Script,
    exs: Sequence[Exchange],
    clock: ReplayClock | None,
    *,
    name: str = "",
    log: Any = print,
    end: bool = True,
) -> None:
    """Each exchange through the app, at its recorded time when ``clock`` is given (else now).
    When more than the session gap passes between two exchanges, the keeper's upkeep runs at
    the moment the session went idle (as its loop would); ``end``: the last session too."""
    gap = app.config.memory.session_gap
    last: float | None = None
    for n, ex in enumerate(exs):
        if clock is not None:
            if last is not None and ex.at - last > gap:  # the person was away
                clock.now = last + gap + 1
                await upkeep(app, log)
            clock.now = ex.answer_at
            last = ex.answer_at
        script.answer = ex.answer
        try:
            await ask(app, transport, fake, ex.message, n, ex.at if clock else None)
        except Unanswered as exc:  # the log then lacks this answer, as for a user
            log(f"  {name}: replay {exc}")
    if end and clock is not None and last is not None:
        clock.now = last + gap + 1
        await upkeep(app, log)


async def tally(
    into: Tally,
    q: Question,
    asked: Coroutine[Any, Any, Any],
    dlg: Dialogue,
    counter: TokenCounter,
    log: Any,
) -> None:
    """Score the reply request ``asked`` returns, or count the question as unanswered."""
    text_of = {t.dia_id: t.text for t in dlg.turns}
    try:
        body = await asked
    except Unanswered as exc:
        log(f"  {q.text[:40]!r}: {exc}")
        into.miss(q.category, str(exc))
        return
    into.add(q.category, score(q, body, text_of), sent_tokens(body, counter))
    if q.category == TEMPORAL:
        into.dated.append(dated(q, body, {t.dia_id: t.created_at for t in dlg.turns}))
    shown = words_shown(q, body, text_of)
    if shown is not None:
        into.words.append(shown)
    sent = "\n".join(str(m["content"]) for m in body["messages"])
    into.chapter += CHAPTER_HEADER in sent
    into.longterm += LONGTERM_HEADER in sent


async def started(
    state: Path,
    base_url: str,
    share: float | None,
    *,
    wall: ReplayClock | None = None,
    llm: LLM | None = None,
    prompt_speed: float | None = None,
) -> tuple[App, MeshLikeTransport]:
    """A started app over ``state``. With ``wall`` (a dated replay) its session loop is
    stopped: the bench drives the same keeper's ticks (``upkeep``) when recorded time passes.
    ``prompt_speed``: the gate reports this many prompt tokens a second as learned (a slow
    server), so recall is held to ``memory.retrieval.recall_seconds`` of it."""
    transport = MeshLikeTransport()
    config = bench_config(state, base_url, share=share)
    app = await build(config, env={}, transports=[transport], llm=llm, wall=wall or time.time)
    if prompt_speed is not None:
        assume_speed(app, prompt_speed)
    await app.start()
    if wall is not None and app.sessions is not None:
        await app.sessions.stop()
    return app, transport


def assume_speed(app: App, speed: float) -> None:
    """The gate reports ``speed`` prompt tokens a second as learned (whatever it measured)."""
    setattr(  # noqa: B010 (the fake answers too fast for the gate to time it)
        app.gate, "tokens_in", lambda s: None if s is None else int(s * speed)
    )


async def kept(app: App, into: Kept) -> None:
    store = app.store
    conv = await store.conversation(ConversationKey(TRANSPORT, PERSON))
    sessions = await store.sessions(conv.id)
    into.conversations += 1
    into.sessions += len(sessions)
    into.summarized += sum(1 for s in sessions if s.summary)
    into.chapters += len(await store.summaries(conv))
    into.facts += len(await store.facts(conv.id))
    into.longterm += int(await store.has_longterm_summary(conv.id))


async def stored_texts(app: App, conv: Conversation) -> list[tuple[str, str]]:
    """(kind, text) of every chapter, session title and summary, long-term summary and fact."""
    store = app.store
    stored: list[tuple[str, str]] = [("chapter", c.text) for c in await store.summaries(conv)]
    for s in await store.sessions(conv.id):
        stored += [("title", s.title or ""), ("session summary", s.summary or "")]
    longterm = await store.longterm_summary(conv.id)
    if longterm is not None:
        stored.append(("long-term summary", longterm.text))
    return stored + [("fact", f.text) for f in await store.facts(conv.id)]


async def show_memory(app: App, log: Any) -> None:
    """Print what the memory holds (``--show-memory``), each name or number in it that
    neither side said marked."""
    conv = await app.store.conversation(ConversationKey(TRANSPORT, PERSON))
    said = said_words(await app.store.all_messages(conv.id))
    stored = await stored_texts(app, conv)
    bad = 0
    for what, text in stored:
        new = invented(text, said)
        bad += bool(new)
        log(f"    {what}: {text[:160]!r}" + (f"  INVENTED {new}" if new else ""))
    log(f"  stored texts with a name or number neither side said: {bad} of {len(stored)}")


async def run_dialogue(
    dlg: Dialogue,
    questions: Sequence[Question],
    *,
    variants: Sequence[str],
    counter: TokenCounter,
    tallies: dict[str, Tally],
    share: float | None = None,
    prompt_speed: float | None = None,
    dated_replay: bool = True,
    memory_llm: LLMConfig | None = None,
    memory: Kept | None = None,
    log: Any = print,
    digest_memory: bool = False,
    show: bool = False,
) -> None:
    """Replay ``dlg`` through the app, then ask ``questions`` (see the module docstring).
    ``dated_replay``: at the recorded dates (else now); ``memory_llm``: a real model writes
    the memory (chapters, summaries, facts), the fake still replays the answers;
    ``digest_memory``: no model writes it (``Digest``)."""
    from tests.fakes.fake_llm import FakeLLM

    fake = FakeLLM()
    script = Script()
    fake.reply_fn = script
    await fake.start()
    exs = exchanges(dlg)
    clock = ReplayClock(exs[0].at) if dated_replay and exs else None
    splits: list[Split] = []  # one per started app (the replay's, each restart question's)
    adapters: list[OpenAICompatLLM] = []

    def router() -> LLM | None:
        if memory_llm is None and not digest_memory:
            return None
        fore = OpenAICompatLLM(config=bench_config(Path("."), fake.base_url).llm, env={})
        adapters.append(fore)
        back: LLM = Digest()
        if memory_llm is not None and not digest_memory:
            back = OpenAICompatLLM(config=memory_llm, env={})
            adapters.append(back)
        splits.append(Split(replies=fore, memory=back))
        return splits[-1]

    try:
        with tempfile.TemporaryDirectory(prefix="meshsage-e2e-") as tmp:
            state = Path(tmp) / "state"
            app, transport = await started(
                state, fake.base_url, share, wall=clock, llm=router(), prompt_speed=prompt_speed
            )
            t0 = time.perf_counter()
            try:
                await replay(app, transport, fake, script, exs, clock, name=dlg.sample_id, log=log)
                log(f"  {dlg.sample_id}: replayed in {time.perf_counter() - t0:.0f} s")
                if memory is not None:
                    await kept(app, memory)
                if show:
                    await show_memory(app, log)
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
                        asked = ask(
                            app,
                            transport,
                            fake,
                            q.text,
                            100_000 + i,
                            None if clock is None else clock.now,
                        )
                        await tally(tallies["live"], q, asked, dlg, counter, log)
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
                    app, transport = await started(
                        copy, fake.base_url, share, wall=clock, llm=router(),
                        prompt_speed=prompt_speed,
                    )  # fmt: skip
                    try:
                        asked = ask(
                            app,
                            transport,
                            fake,
                            q.text,
                            200_000 + i,
                            None if clock is None else clock.now,
                            settle=False,
                        )
                        await tally(tallies["restart"], q, asked, dlg, counter, log)
                    finally:
                        await app.close()
                        shutil.rmtree(copy)
                tallies["restart"].seconds += time.perf_counter() - t0
        background = [b for b in fake.requests if not is_reply(b)]
        if background:
            log(f"  {dlg.sample_id}: {len(background)} memory calls to the fake")
    finally:
        for adapter in adapters:
            await adapter.close()
        await fake.stop()
        if splits:
            calls, failed = sum(x.calls for x in splits), sum(x.failed for x in splits)
            log(f"  {dlg.sample_id}: {calls} memory calls to the model, {failed} failed")


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
    p.add_argument("--sessions", type=int, default=None, help="only the first N sessions of each")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--categories", default="1,2,3,4")
    p.add_argument("--share", type=float, default=None, help="memory.retrieval.share")
    p.add_argument(
        "--prompt-speed",
        type=float,
        help="prompt tokens a second the bot learned its server reads (a Pi: recall is held to "
        "memory.retrieval.recall_seconds of it); default: the fake's, too fast to limit recall",
    )
    p.add_argument(
        "--dated",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay at the conversations' own dates (default); --no-dated: at today's",
    )
    p.add_argument("--memory-url", help="a real model's server (…/v1) writes the memory")
    p.add_argument("--memory-model", default="smollm2-135m", help="its model name")
    p.add_argument(
        "--digest-memory",
        action="store_true",
        help="every model-written text replaced by the digest (the baseline of --memory-url)",
    )
    p.add_argument("--show-memory", action="store_true", help="print what the memory holds")
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
    memory_llm = None
    if args.memory_url:
        memory_llm = LLMConfig(
            base_url=args.memory_url,
            model=args.memory_model,
            api_key_env=None,
            retries=0,
            connect_timeout=60.0,
            read_timeout=900.0,
            temperature=0.0,
        )
    held = Kept()
    for whole in dialogues:
        dlg = first_sessions(whole, args.sessions)
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
                prompt_speed=args.prompt_speed,
                dated_replay=args.dated,
                memory_llm=memory_llm,
                memory=held,
                digest_memory=args.digest_memory,
                show=args.show_memory,
            )
        )
        print(table(tallies, categories), flush=True)
        print(kept_line(held), flush=True)
    command = "python -m bench.memory_e2e " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n{command.strip()}\n{len(dialogues)} conversation(s)\n")
    print(table(tallies, categories))
    print(kept_line(held))
    if args.write_docs:
        names = ", ".join(d.sample_id for d in dialogues)
        write_docs(
            MEMORY_DOC,
            command.replace(" --write-docs", ""),
            names,
            table(tallies, categories) + "\n\n" + kept_line(held),
            real=memory_llm is not None,
        )
        print(f"wrote {MEMORY_DOC}")


def write_docs(path: Path, command: str, names: str, rendered: str, *, real: bool = False) -> None:
    """Replace the table between the markers in ``path`` with this run's (``real``: the
    table of a run whose memory a real model wrote, which has markers of its own)."""
    block = "\n".join(
        [
            f"Command: `{command.strip()}`. Date: {time.strftime('%Y-%m-%d')}. Conversations: "
            f"{names}. Recall = share of a question's evidence turns whose text is in the prompt "
            "sent (mean per category, question count in brackets); temporal dated = share of "
            "temporal questions whose every evidence day is written in the prompt; evidence "
            "words = share of the evidence turns' names, numbers and months in the prompt, "
            "whoever wrote them; older chapter / long-term = prompts holding an older "
            "session's summary / the long-term summary; prompt tokens as the bot counts them; "
            "seconds are wall time on the machine that ran it (not a verdict).",
            "",
            rendered,
        ]
    )
    replace_block(path, *((REAL_START, REAL_END) if real else (MARK_START, MARK_END)), block)


if __name__ == "__main__":
    main()
