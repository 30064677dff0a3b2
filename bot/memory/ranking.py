"""Ranking of one conversation's turns for a query: BM25 over the conversation's own outline,
neighbours lending their score, and the question/answer partner of a chosen turn.

Pure and deterministic: nothing here reads the store or the text of a message. The outline
(``Outline``: ids, roles and token counts, in order) and the query words' postings (message
ids per word, from the store's full-text index) come from ``bot.memory.retrieval``, which
also packs what is ranked into a prompt block.

Invariants:
- Scores use this conversation's statistics only (N, document frequencies, average length),
  with binary term frequency; a turn borrows ``neighbour`` of the better adjacent turn's score
  and half that from two turns away (``NEIGHBOUR_REACH``).
- A turn is returned only if it, or a turn it borrows from, matches at least ``min_share`` of
  the query's IDF mass (words this person never used included), or (hybrid) its similarity
  reaches ``min_similarity``; excluded positions (repeats of the query) score and lend nothing.
- Ties go to the newer turn; work is proportional to the matches, not to the log's length.
"""

from __future__ import annotations

import bisect
import heapq
import math
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.memory.store import USER

NEIGHBOUR_REACH = 2  # default turns on each side a turn borrows from (halving with distance)
QUALIFIED_PER_RESULT = 3  # lexical seeds kept per wanted result on very common queries

__all__ = ["NEIGHBOUR_REACH", "Outline", "Ranked", "bm25_rank", "partners"]


@dataclass(frozen=True, slots=True)
class Ranked:
    """A candidate turn: its id, its final score (higher is better) and the share (0-1) of
    the query's word weight (IDF mass) the turn itself contains (1: every word of the query)."""

    id: int
    score: float
    words: float = 0.0


class Outline:
    """The shape of one conversation's log, in order: ids, roles and token counts (with prefix
    sums), which ranking needs for every turn but never the text. Grown as messages arrive.

    Compact on purpose (about 33 bytes a message: three int64 arrays and a list of two shared
    role strings; ids are sorted, so a message's index is a binary search, not a dict): the
    cache holds the outlines of many long conversations on a Pi."""

    def __init__(self, rows: Sequence[tuple[int, str, int]] = ()) -> None:
        self.ids = array("q")
        self.roles: list[str] = []
        self.tokens = array("q")
        self.prefix = array("q", [0])
        self.extend(rows)

    def extend(self, rows: Sequence[tuple[int, str, int]]) -> None:
        for mid, role, tokens in rows:
            if self.ids and mid <= self.ids[-1]:
                raise ValueError("outline rows must arrive in id order")
            self.ids.append(mid)
            self.roles.append(USER if role == USER else sys.intern(role))
            self.tokens.append(tokens)
            self.prefix.append(self.prefix[-1] + tokens)

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, message_id: int) -> int | None:
        """Position of ``message_id`` in the outline, or None."""
        i = bisect.bisect_left(self.ids, message_id)
        return i if i < len(self.ids) and self.ids[i] == message_id else None

    @property
    def last_id(self) -> int:
        return self.ids[-1] if self.ids else 0

    def span(self, *, after_id: int, before_id: int) -> tuple[int, int]:
        """Index range [lo, hi) of the messages with after_id < id < before_id."""
        return bisect.bisect_right(self.ids, after_id), bisect.bisect_left(self.ids, before_id)


def bm25_rank(
    outline: Outline,
    postings: Sequence[Sequence[int]],
    *,
    span: tuple[int, int] | None = None,
    k1: float,
    b: float,
    neighbour: float,
    min_share: float,
    limit: int | None = None,
    similarity: Mapping[int, float] | None = None,
    weight: float = 0.0,
    min_similarity: float = 1.0,
    exclude: frozenset[int] = frozenset(),
    depth: int = NEIGHBOUR_REACH,
) -> list[Ranked]:
    """Rank the turns of ``outline`` within ``span`` (index range; all by default) for a query
    whose terms matched the ids in ``postings`` (one list per query term). Pure, deterministic,
    and proportional to the number of matches, not to the length of the conversation.

    A turn's score is its own BM25 score (binary tf: chat turns rarely repeat a word) plus
    ``neighbour`` times the better of its two adjacent turns' scores plus half that share of
    the better of the turns two away. A turn is dropped unless it, or a turn it borrows from,
    matches at least ``min_share`` of the query's IDF mass (words this person never used
    included). Ties go to the newer turn. ``limit`` keeps only the best ones.

    Hybrid (``similarity``: message id -> cosine similarity to the query, for the best vector
    matches): the score is ``(1 - weight)`` times the lexical score above, as a share of the
    query's IDF mass, plus ``weight`` times the same neighbourhood sum over similarities (with
    half the neighbour shares); a turn whose similarity reaches ``min_similarity`` qualifies
    like one that passes the lexical floor.

    ``depth`` (``memory.retrieval.context_depth``): how many turns on each side of a turn
    that qualified are candidates and lend their score (the "turns two away" above is the
    default depth, 2).

    ``exclude`` (positions: older turns that repeat the query, ``is_repeat``) still count in
    the words' document frequencies but score nothing, lend nothing and are never returned.
    """
    lo, hi = span if span is not None else (0, len(outline.ids))
    n = hi - lo
    if n <= 0 or not (postings or similarity):
        return []
    avgdl = max((outline.prefix[hi] - outline.prefix[lo]) / n, 1.0)
    terms: list[tuple[float, list[int]]] = []  # (idf, positions in the span)
    for ids in postings:
        hits = [i for i in (outline.index(m) for m in ids) if i is not None and lo <= i < hi]
        df = len(hits)
        if exclude:
            hits = [i for i in hits if i not in exclude]
        terms.append((math.log(1.0 + (n - df + 0.5) / (df + 0.5)), hits))
    possible = sum(idf for idf, _hits in terms)
    floor = min_share * possible if possible > 0 else math.inf
    # The commonest words, together, weigh less than the floor: a turn matching only them can
    # never qualify, so only turns with some other word are worth scoring (most of the work
    # for long histories, where "caroline" or "today" match thousands of turns).
    terms.sort(key=lambda t: t[0])
    common = 0
    total = 0.0
    while common < len(terms) and total + terms[common][0] < floor:
        total += terms[common][0]
        common += 1
    seeds = {i for _idf, hits in terms[common:] for i in hits}
    raw_seeds = _raw(terms, seeds)
    qualified = [i for i, r in raw_seeds.items() if r >= floor and r > 0]
    if limit is not None and len(qualified) > QUALIFIED_PER_RESULT * limit:
        # Only the best-matching turns (and their neighbours) can reach the top ``limit``.
        qualified = heapq.nlargest(
            QUALIFIED_PER_RESULT * limit, qualified, key=lambda i: raw_seeds[i]
        )
    near: dict[int, float] = {}  # position -> similarity, for the vector matches in the span
    if similarity and weight > 0:
        for mid, sim in similarity.items():
            i = outline.index(mid)
            if i is not None and lo <= i < hi and sim > 0 and i not in exclude:
                near[i] = sim
                if sim >= min_similarity:
                    qualified.append(i)
    reach = range(-depth, depth + 1)
    candidates = {i + d for i in qualified for d in reach if lo <= i + d < hi} - exclude
    region = {i + d for i in candidates for d in reach}
    tokens = outline.tokens
    lexical = (1.0 - weight) / possible if possible > 0 else 0.0
    raw = _raw(terms, region)
    own = {
        i: lexical * r * (k1 + 1.0) / (1.0 + k1 * (1.0 - b + b * tokens[i] / avgdl))
        for i, r in raw.items()
    }
    vec = {i: weight * sim for i, sim in near.items()}
    lend = [(d, neighbour / 2 ** (d - 1)) for d in range(1, depth + 1)]
    ranked: list[Ranked] = []
    for i in candidates:  # each is within reach of a turn that qualified
        score = own.get(i, 0.0) + vec.get(i, 0.0)
        for d, share in lend:
            score += share * max(own.get(i - d, 0.0), own.get(i + d, 0.0))
            score += share / 2 * max(vec.get(i - d, 0.0), vec.get(i + d, 0.0))
        if score > 0:
            words = raw.get(i, 0.0) / possible if possible > 0 else 0.0
            ranked.append(Ranked(outline.ids[i], score, words))
    if limit is not None and limit < len(ranked):
        return heapq.nsmallest(limit, ranked, key=_rank_key)
    return sorted(ranked, key=_rank_key)


def _rank_key(r: Ranked) -> tuple[float, int]:
    return (-r.score, -r.id)


def _raw(terms: Sequence[tuple[float, list[int]]], where: set[int]) -> dict[int, float]:
    """Summed IDF of the query words each position in ``where`` contains."""
    raw: dict[int, float] = {}
    for idf, hits in terms:
        for i in hits:
            if i in where:
                raw[i] = raw.get(i, 0.0) + idf
    return raw


def partners(
    outline: Outline, chosen: Sequence[int], *, span: tuple[int, int] | None = None
) -> list[int]:
    """For each chosen turn (in rank order), the turn it pairs with, if not chosen already and
    inside ``span`` (index range; all by default): a person's message pairs with the answer
    that follows it, an answer with the message before it (what it answered)."""
    lo, hi = span if span is not None else (0, len(outline.ids))
    taken = set(chosen)
    out: list[int] = []
    for mid in chosen:
        i = outline.index(mid)
        if i is None:
            continue
        role = outline.roles[i]
        j = i + 1 if role == USER else i - 1
        if lo <= j < hi and outline.roles[j] != role:
            other = outline.ids[j]
            if other not in taken:
                taken.add(other)
                out.append(other)
    return out
