"""Retrieval of older turns relevant to a new message, from this conversation only.

How a turn is ranked (lexical; every step measured in bench/recall, see README "Recall"):
1. The query is the message's distinct content words (stopwords dropped). Each word is looked
   up as its own quoted FTS5 phrase (Porter-stemmed by the index, which also holds each turn's
   author and date), so FTS5 syntax in a message (``"``, ``*``, ``NEAR(``, ``OR``, ``col:``)
   is plain text and any one word can match (FTS5's implicit AND finds nothing for almost
   every question).
2. BM25 with this conversation's own statistics (N, document frequencies, average length),
   binary term frequency and parameters for short chat turns. IDF over one person's history
   says what is rare *for them*, and nobody else's messages are read at all.
3. A turn borrows part of its better neighbour's score (and half that from two turns away):
   an answer rarely repeats the words of the question it answers, and the turns around a
   strong match are usually about the same thing.
4. A turn (or one it borrows from) must match at least ``min_score`` of the query's IDF mass,
   words this person never used included; a question about nothing this person said gets an
   empty block, and its budget goes to the recent window.

Invariants:
- Search is scoped to one conversation and to messages after its reset mark and before the
  recent window (``before_id``), so nothing appears twice and nothing reset comes back.
- The block is packed best-first under the budget, whole turns only; budget left after every
  ranked hit may add a hit's partner (the answer to a retrieved question, or the question a
  retrieved answer answers), never at the expense of a ranked hit.
- The block is rendered chronologically, grouped under one date line per day, each turn with
  its speaker; its token count (as counted by the injected counter) never exceeds the budget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bot.config import RetrievalConfig
from bot.llm.tokens import TokenCounter
from bot.memory.port import MemoryStore
from bot.memory.store import USER, Conversation, StoredMessage

STOPWORDS = frozenset(
    """a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further had hadn't has hasn't have haven't
    having he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll
    i'm i've if in into is isn't it it's its itself let's me more most mustn't my myself no nor
    not of off on once only or other ought our ours ourselves out over own same shan't she
    she'd she'll she's should shouldn't so some such than that that's the their theirs them
    themselves then there there's these they they'd they'll they're they've this those through
    to too under until up very was wasn't we we'd we'll we're we've were weren't what what's
    when when's where where's which while who who's whom why why's with won't would wouldn't
    you you'd you'll you're you've your yours yourself yourselves also just like get got really
    yes yeah oh ok okay well will s t d ll m re ve tell told said say remember know think""".split()  # noqa: SIM905
)

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
MAX_QUERY_TERMS = 24
NEIGHBOUR_REACH = 2  # turns on each side a turn borrows from (halving with distance)


def query_terms(text: str) -> list[str]:
    """Distinct content words of ``text``, in order, lower-cased, without stopwords."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        word = word.replace("'", "")
        if word in STOPWORDS or (len(word) < 2 and not word.isdigit()):
            continue
        seen.setdefault(word, None)
        if len(seen) >= MAX_QUERY_TERMS:
            break
    return list(seen)


def day_label(created_at: float) -> str:
    when = datetime.fromtimestamp(created_at, UTC)
    return f"[{when.day} {when:%b %Y}]"


def render_turn(message: StoredMessage) -> str:
    """One retrieved turn as the model sees it (under its day's date line)."""
    return f"{message.author}: {message.text}"


@dataclass(frozen=True, slots=True)
class RetrievedBlock:
    turns: list[StoredMessage] = field(default_factory=list)  # chronological
    lines: list[str] = field(default_factory=list)
    tokens: int = 0

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass(frozen=True, slots=True)
class Ranked:
    """A candidate turn: its id and its final score (higher is better)."""

    id: int
    score: float


def bm25_rank(
    outline: Sequence[tuple[int, str, int]],
    postings: Sequence[Sequence[int]],
    *,
    k1: float,
    b: float,
    neighbour: float,
    min_share: float,
) -> list[Ranked]:
    """Rank the turns of ``outline`` ((id, role, tokens), in order) for a query whose terms
    matched the ids in ``postings`` (one list per query term). Pure and deterministic.

    A turn's score is its own BM25 score (binary tf: chat turns rarely repeat a word) plus
    ``neighbour`` times the better of its two adjacent turns' scores plus half that share of
    the better of the turns two away. A turn is dropped unless it, or a turn it borrows from,
    matches at least ``min_share`` of the query's IDF mass (words this person never used
    included). Ties go to the newer turn.
    """
    n = len(outline)
    if n == 0 or not postings:
        return []
    position = {mid: i for i, (mid, _role, _tokens) in enumerate(outline)}
    avgdl = max(sum(t for _i, _r, t in outline) / n, 1.0)
    raw = [0.0] * n
    possible = 0.0
    for ids in postings:
        hits = [position[m] for m in ids if m in position]
        df = len(hits)
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        possible += idf
        for i in hits:
            raw[i] += idf
    own = [
        raw[i] * (k1 + 1.0) / (1.0 + k1 * (1.0 - b + b * outline[i][2] / avgdl)) if raw[i] else 0.0
        for i in range(n)
    ]
    lend = [(d, neighbour / 2 ** (d - 1)) for d in range(1, NEIGHBOUR_REACH + 1)]
    floor = min_share * possible
    ranked: list[Ranked] = []
    for i in range(n):
        score = own[i]
        for d, share in lend:
            side = max(own[i - d] if i >= d else 0.0, own[i + d] if i + d < n else 0.0)
            score += share * side
        covered = max(raw[max(0, i - NEIGHBOUR_REACH) : i + NEIGHBOUR_REACH + 1])
        if score > 0 and covered >= floor:
            ranked.append(Ranked(outline[i][0], score))
    ranked.sort(key=lambda r: (-r.score, -r.id))
    return ranked


def partners(outline: Sequence[tuple[int, str, int]], chosen: Sequence[int]) -> list[int]:
    """For each chosen turn (in rank order), the turn it pairs with, if not chosen already:
    a person's message pairs with the answer that follows it, an answer with the message
    before it (what it answered)."""
    position = {mid: i for i, (mid, _r, _t) in enumerate(outline)}
    taken = set(chosen)
    out: list[int] = []
    for mid in chosen:
        i = position.get(mid)
        if i is None:
            continue
        role = outline[i][1]
        j = i + 1 if role == USER else i - 1
        if 0 <= j < len(outline) and outline[j][1] != role and outline[j][0] not in taken:
            taken.add(outline[j][0])
            out.append(outline[j][0])
    return out


class Retriever:
    def __init__(
        self, *, store: MemoryStore, counter: TokenCounter, config: RetrievalConfig
    ) -> None:
        self._store = store
        self._counter = counter
        self._config = config

    async def rank(
        self, conversation: Conversation, query: str, *, before_id: int
    ) -> tuple[list[Ranked], list[tuple[int, str, int]]]:
        """Ranked candidate turns for ``query`` (best first) and the outline they came from."""
        terms = query_terms(query)
        if not terms:
            return [], []
        postings = await self._store.search_terms(
            conversation.id, terms, after_id=conversation.reset_after, before_id=before_id
        )
        if not any(postings):
            return [], []
        outline = await self._store.outline(
            conversation.id, after_id=conversation.reset_after, before_id=before_id
        )
        cfg = self._config
        ranked = bm25_rank(
            outline, postings, k1=cfg.k1, b=cfg.b, neighbour=cfg.neighbour, min_share=cfg.min_score
        )
        return ranked, outline

    async def retrieve(
        self,
        conversation: Conversation,
        query: str,
        *,
        budget_tokens: int,
        before_id: int,
        thread: Sequence[StoredMessage] = (),
    ) -> RetrievedBlock:
        """Best older turns for ``query`` that fit ``budget_tokens`` (rendered, newline-joined).

        ``thread`` is the reply chain the new message answers (nearest first, already older
        than the window): it goes in first, and its words join the query, so a reply such as
        "explain that" brings back what it replies to and what that was about.
        """
        cfg = self._config
        if not cfg.enabled or budget_tokens <= 0 or cfg.max_turns == 0:
            return RetrievedBlock()
        packer = _Packer(self._counter, budget_tokens)
        for msg in thread[: cfg.max_turns]:
            packer.add(msg)
        if thread:
            query = " ".join([query, *(m.text for m in thread[:2])])
        ranked, outline = await self.rank(conversation, query, before_id=before_id)
        if not ranked:
            return packer.block()
        # Enough candidates to fill any budget we are given, without reading every hit's text.
        pool = [r.id for r in ranked[: cfg.max_turns * 3]]
        pool += partners(outline, pool[: cfg.max_turns])
        by_id = {m.id: m for m in await self._store.messages_by_ids(pool)}
        for mid in pool[: cfg.max_turns * 3]:
            if len(packer.chosen) >= cfg.max_turns:
                break
            if mid in by_id:
                packer.add(by_id[mid])
        if len(packer.chosen) < cfg.max_turns:
            for mid in partners(outline, [m.id for m in packer.chosen]):
                if mid in by_id and len(packer.chosen) < cfg.max_turns:
                    packer.add(by_id[mid])
        return packer.block()


class _Packer:
    """Whole turns under a token budget; a day's date line is paid for by its first turn."""

    def __init__(self, counter: TokenCounter, budget: int) -> None:
        self._counter = counter
        self._budget = budget
        self._days: set[str] = set()
        self.chosen: list[StoredMessage] = []
        self.used = 0

    def add(self, message: StoredMessage) -> bool:
        if any(m.id == message.id for m in self.chosen):
            return False
        day = day_label(message.created_at)
        cost = self._counter.count(render_turn(message)) + 1
        if day not in self._days:
            cost += self._counter.count(day) + 1
        if self.used + cost > self._budget:
            return False  # a smaller, lower-ranked turn may still fit
        self._days.add(day)
        self.chosen.append(message)
        self.used += cost
        return True

    def block(self) -> RetrievedBlock:
        turns = sorted(self.chosen, key=lambda m: m.id)
        lines: list[str] = []
        last_day = None
        for msg in turns:
            day = day_label(msg.created_at)
            if day != last_day:
                lines.append(day)
                last_day = day
            lines.append(render_turn(msg))
        return RetrievedBlock(turns=turns, lines=lines, tokens=self.used)
