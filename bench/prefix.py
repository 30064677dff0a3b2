"""How much of each prompt a KV-cache server can reuse: old context layout against the new.

    python -m bench.prefix [--turns 64] [--write-docs]

A scripted conversation (``--turns`` turns per person, at least 60: statements of details,
small talk, and questions about details said long before, so that there are several folds,
summary chapters and retrievals) goes through the real app (``bot.app.build``: responder,
context builder, summarizer, LLM gate, the real OpenAI-compatible adapter over HTTP) to the
fake LLM server (``tests/fakes/fake_llm.py``) on 127.0.0.1, at the mesh defaults (1,536-token
budget, 120 completion tokens, the Meshtastic style hint, answers of about 300 bytes, one
pinned fact at the start and one added midway). The fake's request log is then read back.

Scenarios: one person; two people interleaved (A, B, A, B, ...). After each reply the
benchmark waits until background work (summaries) is done, as a person typing the next
message would give it time to.

Layouts, each on a fresh database in the same run:
- ``old``: the context builder and summarizer before this change (``bench/legacy_context.py``,
  ``bench/legacy_summary.py``, kept verbatim): sliding window, retrieved turns in the system
  message, one rolling summary rewritten at each refresh.
- ``new-inline``: the cache-stable layout (``bot.memory.context``) with recalled turns in the
  final user message.
- ``new-notes``: the same, with recall notes kept at the turn where they were recalled.

Measures (tokens counted with cl100k as the bot counts them: each message's content plus
``MESSAGE_OVERHEAD``, since a chat template's role markers are special tokens; reply requests
are those carrying the transport's style hint, every other request (summary chapters, merges,
fact extraction) is a background call):
- prefix share: for each reply request after a person's first, the identical prefix it shares
  with that person's previous reply request, as a share of its own length (what a server
  with one cache per person could reuse); mean, median, minimum.
- re-evaluated tokens per turn on a one-slot server: every request in arrival order (both
  people's replies and every summary call, cancelled or not) costs the tokens after its
  common prefix with the request just before it; the total divided by the number of turns.
- prompt tokens per turn (mean) and background calls ("summary calls" in the table).
- ``--why``: for each reply after a person's first, the part of the request it is compared
  with where it first differs (a part of the system message: prompt, facts, long-term,
  chapters; a window message; a part of the final message: the recall note, the recall shown
  once, the older chapter shown once, the message; or nothing: it extends it), how often and
  how many tokens that re-read; against the person's previous reply and against the request
  just before (one slot: "after a background call" when that was not a reply).
- ``--one-slot``: the fake is ``OneSlotLLM`` (one request at a time, a cache of the last
  prompt and its answer, its own count of 4 characters of its template a token); it adds
  the prompt tokens it evaluated per reply (issue 27's "reply re-evaluation").

Nothing is timed: the figures are exact counts of what was sent (the number of background
calls can vary by one or two between runs: fold-time fact extraction starts only when the
LLM gate expects it to fit, which it learns from real time). docs/memory.md's tables are
rewritten only with ``--write-docs`` (the ``--why`` table too when given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from bench.legacy_context import ContextBuilder as LegacyContextBuilder
from bench.legacy_summary import PROMPT as LEGACY_SUMMARY_PROMPT
from bench.legacy_summary import Summarizer as LegacySummarizer
from bot.app import App, build
from bot.config import (
    BotConfig,
    Config,
    LLMConfig,
    MemoryConfig,
    RateLimit,
)
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply, TransportLimits
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter, make_counter
from bot.memory.chapter_text import CHAPTER_PROMPT, CONTINUATION_MARK, MERGE_PROMPT
from bot.memory.context import (
    FACTS_HEADER,
    MORE_HEADER,
    NEW_FACTS_HEADER,
    RETRIEVED_HEADER,
    SUMMARY_HEADER,
    ContextBuilder,
)
from bot.memory.layers import LONGTERM_HEADER
from bot.memory.older_chapter import CHAPTER_HEADER
from bot.memory.summary import Summarizer
from bot.transports.base import OnMessage
from bot.transports.mesh_text import fit

ROOT = Path(__file__).resolve().parent.parent
MEMORY_DOC = ROOT / "docs" / "memory.md"
MARK_START = "<!-- bench:prefix:start -->"
MARK_END = "<!-- bench:prefix:end -->"
WHY_START = "<!-- bench:prefix-why:start -->"
WHY_END = "<!-- bench:prefix-why:end -->"
TRANSPORT = "bench"
CONTEXT_TOKENS = 1536  # meshtastic.context_tokens default
MAX_TOKENS = 120  # meshtastic.max_tokens default
CHUNK_BYTES = 200
MAX_PARTS = 3
STYLE_HINT = (  # what MeshtasticTransport sends with the default chunk_bytes and max_parts
    "You are answering over LoRa radio: reply in plain text, no markdown or lists, "
    f"ideally under {CHUNK_BYTES} bytes (about {CHUNK_BYTES // 6} words) "
    f"and never more than {CHUNK_BYTES * MAX_PARTS} bytes."
)
ANSWER_BYTES = 300
LAYOUTS = ("old", "new-inline", "new-notes")
SUMMARY_PREFIXES = tuple(
    p.split("{", 1)[0] for p in (LEGACY_SUMMARY_PROMPT, CHAPTER_PROMPT, MERGE_PROMPT)
)

DETAILS = [
    ("My boat is called Osprey and she is moored at the north pier.", "What is my boat called?"),
    ("My sister Ingrid lives in Bergen and works as a nurse.", "Where does my sister live?"),
    ("I run the repeater on Mount Storsteinen at 433 MHz.", "Which frequency is my repeater on?"),
    ("Our club meets every second Thursday in the old fire station.", "When does our club meet?"),
    ("My dog Pepper is afraid of thunderstorms.", "What is my dog afraid of?"),
    ("I am saving for a new solar panel, the 100 watt one.", "What panel was I saving for?"),
    ("The antenna on the shed is a 5/8 wave vertical I built myself.", "What antenna did I build?"),
    ("My daughter Mia starts school in August.", "When does Mia start school?"),
    ("I keep the spare battery in the blue toolbox.", "Where is the spare battery?"),
    ("The node in the cabin runs on firmware 2.5 and a RAK board.", "What board is in the cabin?"),
    ("My favourite soup is fish soup with saffron.", "Which soup do I like best?"),
    ("Next week I drive to Lyngen to hike with Tor.", "Who am I hiking with?"),
]
SMALL_TALK = [
    "How is the weather looking for tomorrow around here?",
    "Any tips for keeping batteries warm in winter?",
    "What is a good way to waterproof a small enclosure?",
    "Tell me something interesting about radio propagation.",
    "Should I use a longer antenna cable or move the node?",
    "How often should I check the solar charge controller?",
    "What makes LoRa work so well over long distances?",
    "Can you suggest a simple dinner for a cold evening?",
    "How do I explain mesh networks to my neighbour?",
    "What should go in an emergency kit for the cabin?",
]
FILLER = (
    "That depends on the conditions and the hardware, but a careful setup usually works well. "
    "Keep connections dry, check the power budget, and test one change at a time. "
    "Write down what you changed so you can go back if it gets worse. "
    "Ask the club if someone has tried the same thing before. "
)


def script(turns: int, *, seed: int) -> list[str]:
    """``turns`` user messages (plus two ``!remember`` commands: one first, one midway):
    details early, questions about them much later, small talk between."""
    rng = random.Random(seed)
    order = list(range(len(DETAILS)))
    rng.shuffle(order)
    said: list[int] = []
    out: list[str] = ["!remember I live in Tromsø and my callsign is LA9XYZ."]
    for n in range(1, turns + 1):
        if n == turns // 2:
            out.append("!remember I prefer answers in metric units.")
        r = rng.random()
        if order and (r < 0.3 or not said):
            said.append(order.pop())
            out.append(DETAILS[said[-1]][0])
        elif len(said) > 3 and r < 0.6:
            out.append(DETAILS[rng.choice(said[:-3])][1])  # asked long after it was said
        else:
            out.append(rng.choice(SMALL_TALK) + f" ({n})")
    return out


def answer(body: dict[str, Any]) -> str:
    """The fake's deterministic answer: ~300 bytes for a reply, ~50 words for a summary."""
    messages = body["messages"]
    if str(messages[-1]["content"]).startswith(CONTINUATION_MARK):  # a fold: last reply's
        words = str(messages[-3]["content"]).split() if len(messages) > 2 else []
        return "The person talked about " + " ".join(words[-40:])[:300] + "."
    if str(messages[0]["content"]).startswith(SUMMARY_PREFIXES):
        words = str(messages[-1]["content"]).split()
        return "The person talked about " + " ".join(words[-40:])[:300] + "."
    question = str(messages[-1]["content"]).rsplit("\n\n", 1)[-1]
    head = " ".join(question.split()[:6])
    return (f"About '{head}': " + FILLER)[:ANSWER_BYTES]


class MeshLikeTransport:
    """A transport twin with the Meshtastic defaults: budget, style hint and ``fit``."""

    name = TRANSPORT

    def __init__(self, *, max_tokens: int = MAX_TOKENS) -> None:
        self.limits = TransportLimits(
            context_tokens=CONTEXT_TOKENS, max_tokens=max_tokens, style_hint=STYLE_HINT
        )
        self.sent: list[Reply] = []
        self._on_message: OnMessage | None = None
        self._closed = asyncio.Event()

    def fit(self, text: str) -> str:
        return fit(text, chunk_bytes=CHUNK_BYTES, max_parts=MAX_PARTS)

    @contextlib.asynccontextmanager
    async def working(self, inbound: Inbound) -> AsyncIterator[None]:
        yield

    async def start(self, on_message: OnMessage) -> None:
        self._on_message = on_message

    async def send(self, reply: Reply) -> Delivery:
        self.sent.append(reply)
        return Delivery(DeliveryStatus.SENT, message_ids=(f"bench-{len(self.sent)}",))

    async def inject(self, inbound: Inbound) -> None:
        assert self._on_message is not None
        await self._on_message(inbound)

    async def stop(self) -> None:
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()


def bench_config(state_dir: Path, base_url: str, *, share: float | None = None) -> Config:
    memory = MemoryConfig()
    if share is not None:  # memory.retrieval.share, as a config file would set it
        retrieval = memory.retrieval.model_copy(update={"share": share})
        memory = memory.model_copy(update={"retrieval": retrieval})
    return Config(
        state_dir=state_dir,
        # The fake server shares this process's event loop: on a starved machine its 5 s connect
        # timeout expired before the fake read a request (bench.memory_e2e, load ~12).
        llm=LLMConfig(
            base_url=base_url, model="fake", api_key_env=None, retries=0, connect_timeout=60.0
        ),
        bot=BotConfig(rate_limit=RateLimit(messages=10_000, per_seconds=1.0), queue_limit=100),
        memory=memory,
    )


def use_layout(app: App, layout: str) -> None:
    """Swap the old builder and summarizer into a built app, or pick the recall mode."""
    parts: Any = app.responder.parts  # the turn pipeline's parts (bot.responder.Pipeline)
    layered = app.context  # the one the answerer's FittingAsk builds prompts with
    assert parts.answerer._fit._context is layered, (
        "the answerer no longer builds its prompts from app.context; update bench.prefix"
    )
    if layout == "old":
        cfg = app.config.memory
        context = LegacyContextBuilder(
            store=app.store,
            retriever=layered.inner._retriever,
            counter=app.counter,
            system_prompt=app.config.bot.system_prompt,
            retrieval_share=cfg.retrieval.share,
        )
        summarizer = LegacySummarizer(
            store=app.store, llm=app.gate.background, counter=app.counter, config=cfg.summary
        )
        layered.inner = cast(ContextBuilder, context)  # the memory tiers stay around it
        parts.answerer._summarizer = summarizer  # folds after answers
        parts.command_turns._summarizer = summarizer  # !reset / !forget stop its folds
        app.summarizer = cast(Summarizer, summarizer)
    else:
        layered.inner.recall = "notes" if layout == "new-notes" else "inline"


@dataclass(frozen=True, slots=True)
class Result:
    scenario: str
    layout: str
    turns: int
    summaries: int
    cancelled: int
    share_mean: float
    share_median: float
    share_min: float
    reeval_per_turn: float
    reply_reeval_per_turn: float  # of which in reply requests
    prompt_per_turn: float
    # part that changed first -> (replies, tokens re-read): against the person's previous
    # reply, and against the request just before (one slot)
    why: dict[str, tuple[int, float]] = field(default_factory=dict)
    why_slot: dict[str, tuple[int, float]] = field(default_factory=dict)
    # ``--one-slot``: prompt tokens the one-slot fake evaluated per reply (its own count: 4
    # characters of its template a token; its cache holds the last prompt and its answer)
    slot_reply_eval: float | None = None


def is_reply(body: dict[str, Any]) -> bool:
    """A reply request carries the transport's style hint; background calls (summary chapters,
    merges, fact extraction, session summaries) do not, except a fold sent as the
    continuation of a reply's prompt, which ends with its task."""
    messages = body["messages"]
    if str(messages[-1]["content"]).startswith(CONTINUATION_MARK):
        return False
    return STYLE_HINT in str(messages[0]["content"])


def prompt_tokens(messages: Sequence[dict[str, Any]], counter: TokenCounter) -> int:
    """A request's size as the bot counts it against its budget: each message's content plus
    ``MESSAGE_OVERHEAD`` (the role markers, which a chat template adds as special tokens)."""
    return sum(counter.count(str(m["content"])) + MESSAGE_OVERHEAD for m in messages)


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_tokens(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], counter: TokenCounter
) -> int:
    """Tokens at the start of ``after`` identical to ``before`` (as the bot counts them): whole
    equal messages, then the common start of the first message that differs (same role)."""
    shared = 0
    for a, b in zip(before, after, strict=False):
        if a["role"] != b["role"]:
            break
        x, y = str(a["content"]), str(b["content"])
        if x == y:
            shared += counter.count(y) + MESSAGE_OVERHEAD
            continue
        shared += counter.count(y[: common_prefix(x, y)])
        break
    return shared


def measure(
    requests: Sequence[dict[str, Any]], owners: Sequence[str | None], counter: TokenCounter
) -> tuple[list[float], tuple[float, float], float, int]:
    """(same-person prefix shares, re-evaluated tokens (all, in replies), prompt tokens of
    replies, background calls) for requests in arrival order; ``owners`` names the person of
    each reply (None: a background call). Tokens are counted as the bot counts them
    (``prompt_tokens``)."""
    shares: list[float] = []
    last_of: dict[str, list[dict[str, Any]]] = {}
    previous: list[dict[str, Any]] = []
    reeval = 0.0
    reply_reeval = 0.0
    prompt = 0.0
    summaries = 0
    for body, owner in zip(requests, owners, strict=True):
        messages = body["messages"]
        tokens = prompt_tokens(messages, counter)
        cost = tokens - shared_tokens(previous, messages, counter)
        reeval += cost
        reply_reeval += cost if owner is not None else 0
        previous = messages
        if owner is None:
            summaries += 1
            continue
        prompt += tokens
        if owner in last_of:
            shares.append(shared_tokens(last_of[owner], messages, counter) / tokens)
        last_of[owner] = messages
    return shares, (reeval, reply_reeval), prompt, summaries


# Where a prompt's parts begin, as the context builder writes them (``where``).
SYSTEM_PARTS = (
    ("facts", FACTS_HEADER),
    ("long-term", LONGTERM_HEADER),
    ("chapters", SUMMARY_HEADER),
)
FINAL_PARTS = (
    ("new facts", NEW_FACTS_HEADER),
    ("recall note", RETRIEVED_HEADER),
    ("recall, once", MORE_HEADER),
    ("older chapter, once", CHAPTER_HEADER),
)


def where(messages: Sequence[dict[str, Any]], index: int, at: int) -> str:
    """The part of a prompt (``messages``) that holds character ``at`` of message ``index``:
    a part of the system message, a window message, or a part of the final message."""
    content = str(messages[index]["content"])
    if index == 0:
        parts = [(content.find(h), name) for name, h in SYSTEM_PARTS if h in content]
        found = [name for start, name in sorted(parts) if start <= at]
        return "system: " + (found[-1] if found else "prompt")
    if index < len(messages) - 1:
        return "window"
    parts = [(content.find(h), name) for name, h in FINAL_PARTS if h in content]
    found = [name for start, name in sorted(parts) if start <= at]
    return "final: " + (found[-1] if found else "message")


def first_break(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
) -> tuple[str, int, int]:
    """Where ``after`` first differs from ``before``: the part of ``before`` that changed
    (``where``), the message index and the character offset in it."""
    for i, (a, b) in enumerate(zip(before, after, strict=False)):
        x, y = str(a["content"]), str(b["content"])
        if a["role"] != b["role"]:
            return where(before, i, 0), i, 0
        if x != y:
            at = common_prefix(x, y)
            return where(before, i, at), i, at
    return "nothing (extends it)", len(before), 0


def breaks(
    requests: Sequence[dict[str, Any]],
    owners: Sequence[str | None],
    counter: TokenCounter,
    *,
    one_slot: bool = False,
    evaluated: Sequence[float] | None = None,
) -> dict[str, tuple[int, float]]:
    """For each reply after a person's first: which part of the request compared against
    (the person's previous reply; ``one_slot``: the request just before, of any kind) changed
    first, and the tokens of the reply re-read from there on (``evaluated``: what the server
    evaluated for each request instead). Part -> (replies, tokens)."""
    out: dict[str, tuple[int, float]] = {}
    last_of: dict[str, Sequence[dict[str, Any]]] = {}
    previous: Sequence[dict[str, Any]] = []
    before_owner: str | None = None
    for k, (body, owner) in enumerate(zip(requests, owners, strict=True)):
        messages = body["messages"]
        against = previous if one_slot else last_of.get(owner or "", [])
        if owner is not None and against:
            label, _i, _at = first_break(against, messages)
            if one_slot and before_owner != owner:
                after = "a background call" if before_owner is None else "another person"
                label = f"after {after}: {label}"
            lost = float(
                prompt_tokens(messages, counter) - shared_tokens(against, messages, counter)
            )
            if evaluated is not None:
                lost = evaluated[k]
            n, t = out.get(label, (0, 0.0))
            out[label] = (n + 1, t + lost)
        if owner is not None:
            last_of[owner] = messages
        previous, before_owner = messages, owner
    return out


async def run(
    layout: str,
    scenario: str,
    turns: int,
    seed: int,
    counter: TokenCounter,
    share: float | None = None,
    *,
    one_slot: bool = False,
) -> Result:
    from tests.fakes.fake_llm import FakeLLM, OneSlotLLM

    # One slot: a server that caches the last prompt and its answer; its clock runs 1,000
    # times faster than the real one (the bench waits for background work between turns).
    fake = (
        OneSlotLLM(scale=0.001, is_background=lambda body: not is_reply(body))
        if one_slot
        else FakeLLM()
    )
    fake.reply_fn = answer
    await fake.start()
    people = ["alice"] if scenario == "one person" else ["alice", "bob"]
    scripts = {p: script(turns, seed=seed + i) for i, p in enumerate(people)}
    with tempfile.TemporaryDirectory() as d:
        transport = MeshLikeTransport()
        app = await build(
            bench_config(Path(d), fake.base_url, share=share), env={}, transports=[transport]
        )
        use_layout(app, layout)
        owners: list[str | None] = []
        try:
            await app.start()
            for n in range(len(scripts[people[0]])):
                for person in people:
                    text = scripts[person][n]
                    before = len(fake.requests)
                    await transport.inject(
                        Inbound(
                            transport=TRANSPORT,
                            sender=person,
                            text=text,
                            message_id=f"{person}-{n}",
                            sender_name=person.title(),
                            authenticated=True,  # a known person (bot.trust)
                        )
                    )
                    await app.responder.wait_idle()
                    # The person types; summaries and fold-time fact extraction may run (the
                    # old summarizer has no event and extracts no facts at folds).
                    quiet = getattr(app.summarizer, "wait_quiet", None)
                    if quiet is not None:
                        await quiet()
                    while app.summarizer.running:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                    for body in fake.requests[before:]:
                        owners.append(person if is_reply(body) else None)
        finally:
            await app.close()
            await fake.stop()
    late = fake.requests[len(owners) :]  # background work still running at the end
    if any(is_reply(body) for body in late):
        raise RuntimeError("a reply request arrived after its turn was counted")
    owners += [None] * len(late)
    replies = sum(1 for o in owners if o is not None)
    shares, (reeval, reply_reeval), prompt, summaries = measure(fake.requests, owners, counter)
    return Result(
        scenario=scenario,
        layout=layout,
        turns=replies,
        summaries=summaries,
        cancelled=fake.cancelled,
        share_mean=statistics.mean(shares),
        share_median=statistics.median(shares),
        share_min=min(shares),
        reeval_per_turn=reeval / replies,
        reply_reeval_per_turn=reply_reeval / replies,
        prompt_per_turn=prompt / replies,
        why=breaks(fake.requests, owners, counter),
        why_slot=breaks(
            fake.requests,
            owners,
            counter,
            one_slot=True,
            evaluated=(
                [float(r.evaluated) for r in sorted(fake.served, key=lambda r: r.index)]
                if isinstance(fake, OneSlotLLM)
                else None
            ),
        ),
        slot_reply_eval=(
            statistics.mean(r.evaluated for r in fake.replies())
            if isinstance(fake, OneSlotLLM)
            else None
        ),
    )


def why_table(results: Sequence[Result]) -> str:
    """Which part of the prompt changed first between consecutive replies (``breaks``)."""
    lines = [
        "| scenario | layout | compared with | part that changed first | replies "
        "| tokens re-read (total) | per reply |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for r in results:
        slot = "request before (tokens: the one-slot fake's count)" if r.slot_reply_eval else ""
        for against, why in (
            ("same person's previous reply", r.why),
            (slot or "request before", r.why_slot),
        ):
            for label, (n, t) in sorted(why.items(), key=lambda kv: -kv[1][1]):
                lines.append(
                    f"| {r.scenario} | {r.layout} | {against} | {label} | {n} | {t:.0f} "
                    f"| {t / n:.0f} |"
                )
    return "\n".join(lines)


def table(results: Sequence[Result]) -> str:
    lines = [
        "| scenario | layout | replies | summary calls | prefix share mean | median | min "
        "| re-evaluated tokens/turn (one slot) | prompt tokens/turn |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.scenario} | {r.layout} | {r.turns} | {r.summaries} | {r.share_mean:.1%} "
            f"| {r.share_median:.1%} | {r.share_min:.1%} | {r.reeval_per_turn:.0f} "
            f"({r.reply_reeval_per_turn:.0f} in replies) "
            f"| {r.prompt_per_turn:.0f} |"
        )
    return "\n".join(lines)


def write_docs(path: Path, command: str, results: Sequence[Result], *, why: bool = False) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    head = (
        f"Command: `{command}`. Date: {time.strftime('%Y-%m-%d')}. Load average {load} "
        f"({platform.machine()}, {os.cpu_count()} cores). Exact counts of what was sent "
        "(cl100k tokens as the bot counts them: content + 4 per message), not timings; "
        "summary calls = every background call (chapters, merges, fact extraction)."
    )
    replace_block(path, MARK_START, MARK_END, "\n".join([head, "", table(results)]))
    if why:  # the default layout's account of what broke the prefix
        notes = [r for r in results if r.layout == "new-notes"]
        replace_block(path, WHY_START, WHY_END, "\n".join([head, "", why_table(notes)]))


def replace_block(path: Path, start: str, end: str, block: str) -> None:
    """Put ``block`` between the ``start`` and ``end`` markers of ``path`` (a docs table)."""
    text = path.read_text()
    if start not in text:
        raise SystemExit(f"{path} has no {start} marker; add one where the table goes")
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1] if end in rest else ""
    path.write_text(head + start + "\n" + block + "\n" + end + tail)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.prefix", description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=64, help="turns per person (at least 60)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument(
        "--write-docs", action="store_true", help="rewrite docs/memory.md's prefix table"
    )
    p.add_argument("--share", type=float, default=None, help="memory.retrieval.share")
    p.add_argument("--scenarios", default="one person,two people")
    p.add_argument(
        "--one-slot",
        action="store_true",
        help="serve from the one-slot fake (OneSlotLLM) and report what it evaluated per reply",
    )
    p.add_argument(
        "--why", action="store_true", help="which part of the prompt changed first, how often"
    )
    args = p.parse_args(argv)
    counter = make_counter()
    results: list[Result] = []
    for scenario in args.scenarios.split(","):
        for layout in args.layouts.split(","):
            if layout not in LAYOUTS:
                p.error(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
            results.append(
                asyncio.run(
                    run(
                        layout,
                        scenario,
                        args.turns,
                        args.seed,
                        counter,
                        args.share,
                        one_slot=args.one_slot,
                    )
                )
            )
            print(table(results[-1:]).splitlines()[-1], flush=True)
            if results[-1].slot_reply_eval is not None:
                print(f"one-slot fake: {results[-1].slot_reply_eval:.1f} prompt tokens "
                      "evaluated per reply (its count)", flush=True)  # fmt: skip
    print()
    print(table(results))
    if args.why:
        print()
        print(why_table(results))
    if args.write_docs:
        command = f"python -m bench.prefix --turns {args.turns} --seed {args.seed}"
        command += " --why" * args.why + " --one-slot" * args.one_slot
        write_docs(MEMORY_DOC, command, results, why=args.why)
        print(f"wrote {MEMORY_DOC}")


if __name__ == "__main__":
    main()
