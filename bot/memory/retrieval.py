"""Retrieval of older turns relevant to a new message, from this conversation only.

This module reads (the query's postings, the outline, the chosen turns' text) and packs;
the scoring itself, steps 2-5 below, is ``bot.memory.ranking`` (pure, no store).

How a turn is ranked (lexical; every step measured in bench/recall, see docs/memory.md "Recall"):
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
5. With embeddings (``memory.embeddings``), the score is a weighted sum of the lexical score
   (as a share of the query's IDF mass) and the cosine similarity, each borrowed from
   neighbours the same way; a turn similar enough (``min_similarity``) qualifies on its own.
   If the embedding server is down, words alone rank (one warning per outage).

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

import asyncio
import heapq
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from bot.config import RetrievalConfig
from bot.errors import EmbeddingUnavailable
from bot.llm.tokens import TokenCounter
from bot.memory.embeddings import Embedder
from bot.memory.port_log import ConversationLog
from bot.memory.port_recall import Recall
from bot.memory.ranking import Outline, Ranked, bm25_rank, partners
from bot.memory.reads import at_once
from bot.memory.store import USER, Conversation, StoredMessage

log = logging.getLogger("bot.memory.retrieval")

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


class RetrievalStore(ConversationLog, Recall, Protocol):
    """What retrieval searches and reads."""


_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
MAX_QUERY_TERMS = 24
VECTOR_POOL = 2000  # vector matches considered per query (weak ones still lend to neighbours)
MAX_QUERY_CHARS = 2000  # of the new message, embedded for vector search
OUTLINE_CACHE = 256  # conversations whose outline stays in memory (about 33 bytes a message)
COMPLETE_MATCH = 0.99  # share of the query's word weight one turn holds: it answers, surely
REPEAT_SIMILARITY = 0.8  # shared share of both word sets at which an older turn repeats the query
REPEAT_CANDIDATES = 32  # turns sharing the most query words checked for being a repeat
OUTLINE_CACHE_MESSAGES = 300_000  # and at most this many messages in all (~10 MB): RSS plateaus


def query_terms(text: str, *, limit: int | None = MAX_QUERY_TERMS) -> list[str]:
    """Distinct content words of ``text``, in order, lower-cased, without stopwords (at most
    ``limit``; None: all)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        word = word.replace("'", "")
        if word in STOPWORDS or (len(word) < 2 and not word.isdigit()):
            continue
        seen.setdefault(word, None)
        if limit is not None and len(seen) >= limit:
            break
    return list(seen)


def is_repeat(text: str, terms: Sequence[str]) -> bool:
    """Whether an older turn's ``text`` says again what a query with content words ``terms``
    says (a greeting, a phrase the person repeats, the same question asked again): the words
    they share are at least ``REPEAT_SIMILARITY`` of each one's content words, so the turn adds
    next to nothing the message does not already say ("my dog likes hi" is not a repeat of
    "dog hi"). Such a turn is neither recalled nor counted as a match."""
    mine = set(query_terms(text))
    wanted = set(terms)
    if not mine or not wanted:
        return False
    return len(mine & wanted) >= REPEAT_SIMILARITY * max(len(mine), len(wanted))


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
    reasons: dict[int, str] = field(default_factory=dict)  # message id -> why it is here
    order: list[StoredMessage] = field(default_factory=list)  # best first (thread, then rank)
    core: int | None = None  # of ``order``: those before the spare-room filling (all if None)
    budget: int = 0  # the room it was packed in (its parts, each with its own date lines, fit)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def head(
        self,
        counter: TokenCounter,
        budget: int,
        *,
        without: RetrievedBlock | None = None,
        core: bool = False,
    ) -> RetrievedBlock:
        """The best turns of this block that fit ``budget`` (what a recall note keeps), leaving
        out the turns of ``without`` (the rest of a recall once its note is taken); ``core``:
        only from the turns taken before spare room was filled (a note never holds filler)."""
        taken = {m.id for m in without.turns} if without is not None else set()
        packer = _Packer(counter, budget)
        for msg in self.order[: self.core] if core else self.order:
            if msg.id not in taken:
                packer.add(msg, self.reasons.get(msg.id, ""))
        return packer.block()

    def split(
        self, counter: TokenCounter, cap: int, *, room: int | None
    ) -> tuple[RetrievedBlock, RetrievedBlock]:
        """This recall as its note (the best turns within ``cap``, never filler) and the part
        shown once. ``room`` (a slow server's, which held this recall back): the part shown
        once takes every other turn chosen, in the room the whole was packed in (``budget``)
        plus the date lines both parts print for a day they share, never past ``room``; there,
        packed in what the whole used, a repeated date line pushed a chosen turn out of the
        prompt (issue 37: 0.06 of the dev evidence at 200 tokens of recall). None: the parts
        keep to what the whole used (the tail a cache cannot keep stays as short: bench.prefix).
        """
        if self.tokens <= cap and self.core in (None, len(self.order)):
            return self, RetrievedBlock()
        held = self.head(counter, cap, core=True)
        packed = self.tokens
        if room is not None:
            noted = {m.id for m in held.turns}
            days = {day_label(m.created_at) for m in held.turns}
            shared = {day_label(m.created_at) for m in self.turns if m.id not in noted} & days
            again = sum(counter.count(day) + 1 for day in shared)
            packed = min(max(self.budget, self.tokens) + again, room)
        return held, self.head(counter, packed - held.tokens, without=held)


class Retriever:
    """Ranks and packs older turns. Keeps a bounded, in-process cache of each recently active
    conversation's ``Outline``, grown incrementally and rebuilt when its row count says
    messages were deleted (``!forget``, retention) — by this process or any other."""

    def __init__(
        self,
        *,
        store: RetrievalStore,
        counter: TokenCounter,
        config: RetrievalConfig,
        embedder: Embedder | None = None,
        embedding_weight: float = 0.5,
        min_similarity: float = 0.3,
        query_timeout: float = 1.0,
    ) -> None:
        self._store = store
        self._counter = counter
        self._config = config
        self._embedder = embedder
        self._weight = embedding_weight if embedder is not None else 0.0
        self._min_similarity = min_similarity
        self._query_timeout = query_timeout
        self._embedder_down = False
        self._outlines: OrderedDict[int, Outline] = OrderedDict()
        self._cached_messages = 0  # messages in all cached outlines

    async def _similar(
        self, conversation: Conversation, query: str, *, before_id: int
    ) -> dict[int, float]:
        """Cosine similarity of the best vector matches, or nothing when embeddings are off or
        the embedding server is down (then words alone rank, and the indexer catches up)."""
        if self._embedder is None or self._weight <= 0 or not query.strip():
            return {}
        try:
            async with asyncio.timeout(self._query_timeout):
                [vector] = await self._embedder.embed([query[:MAX_QUERY_CHARS]])
        except TimeoutError:
            log.info("the query embedding took over %.1f s; ranking by words", self._query_timeout)
            return {}
        except EmbeddingUnavailable as exc:
            if not self._embedder_down:
                log.warning("retrieval uses words only until embeddings are back: %s", exc)
            self._embedder_down = True
            return {}
        if self._embedder_down:
            log.info("retrieval uses embeddings again")
        self._embedder_down = False
        hits = await self._store.vector_search(
            conversation.id,
            vector,
            model=self._embedder.model,
            after_id=conversation.reset_after,
            before_id=before_id,
            limit=VECTOR_POOL,
        )
        return dict(hits)

    async def outline(self, conversation_id: int) -> Outline:
        """This conversation's whole outline, current as of now."""
        cached = self._outlines.pop(conversation_id, None) or Outline()
        before = len(cached)
        async with at_once() as reads:  # the rows since, and the count that checks them
            rows = reads.create_task(
                self._store.outline(conversation_id, after_id=cached.last_id, before_id=1 << 62)
            )
            count = reads.create_task(self._store.count_messages(conversation_id))
        cached.extend(rows.result())
        if len(cached.ids) != count.result():
            cached = Outline(
                await self._store.outline(conversation_id, after_id=0, before_id=1 << 62)
            )
        self._outlines[conversation_id] = cached
        self._cached_messages += len(cached) - before
        while len(self._outlines) > 1 and (
            len(self._outlines) > OUTLINE_CACHE or self._cached_messages > OUTLINE_CACHE_MESSAGES
        ):
            _, evicted = self._outlines.popitem(last=False)
            self._cached_messages -= len(evicted)
        return cached

    async def rank(
        self, conversation: Conversation, query: str, *, before_id: int
    ) -> tuple[list[Ranked], Outline, tuple[int, int]]:
        """Ranked candidate turns for ``query`` (best first), the outline they came from and
        the index span searched (after the reset mark, before ``before_id``)."""
        terms = query_terms(query)
        postings: list[list[int]] = []
        if terms:  # the outline is read with the postings: most messages with words match
            async with at_once() as reads:
                found = reads.create_task(
                    self._store.search_terms(
                        conversation.id,
                        terms,
                        after_id=conversation.reset_after,
                        before_id=before_id,
                    )
                )
                current = reads.create_task(self.outline(conversation.id))
            postings = found.result()
        similarity = await self._similar(conversation, query, before_id=before_id)
        if not any(postings) and not similarity:
            return [], Outline(), (0, 0)
        outline = current.result() if terms else await self.outline(conversation.id)
        span = outline.span(after_id=conversation.reset_after, before_id=before_id)
        repeats = await self._repeats(terms, postings, outline)
        cfg = self._config
        ranked = bm25_rank(
            outline,
            postings,
            span=span,
            k1=cfg.k1,
            b=cfg.b,
            neighbour=cfg.neighbour,
            min_share=cfg.min_score,
            limit=cfg.max_turns * 3,
            similarity=similarity,
            weight=self._weight,
            min_similarity=self._min_similarity,
            exclude=repeats,
            depth=cfg.context_depth,
        )
        return ranked, outline, span

    async def _repeats(
        self, terms: Sequence[str], postings: Sequence[Sequence[int]], outline: Outline
    ) -> frozenset[int]:
        """Positions of the person's older messages that repeat the query (``is_repeat``), with
        the answers that followed each: only messages that contain enough of its words can
        repeat it, and the ``REPEAT_CANDIDATES`` with the most are read."""
        need = math.ceil(REPEAT_SIMILARITY * len(terms))
        counts: dict[int, int] = {}
        for ids in postings:
            for mid in ids:
                counts[mid] = counts.get(mid, 0) + 1
        likely = [mid for mid, c in counts.items() if c >= need]
        if not likely:
            return frozenset()
        likely = heapq.nlargest(REPEAT_CANDIDATES, likely, key=lambda m: (counts[m], m))
        found: set[int] = set()
        for msg in await self._store.messages_by_ids(likely):
            at = outline.index(msg.id)
            if at is not None and msg.role == USER and is_repeat(msg.text, terms):
                found.add(at)  # and the answers to it: what was said to it then, not new
                while at + 1 < len(outline) and outline.roles[at + 1] != USER:
                    at += 1
                    found.add(at)
        return frozenset(found)

    async def retrieve(
        self,
        conversation: Conversation,
        query: str,
        *,
        budget_tokens: int,
        before_id: int,
        thread: Sequence[StoredMessage] = (),
        weight: Callable[[float], float] | None = None,
        floor: int = 0,
        skip: Callable[[StoredMessage], bool] | None = None,
        relative: float = 0.0,
        spare_tokens: int = 0,
    ) -> RetrievedBlock:
        """Best older turns for ``query`` that fit ``budget_tokens`` (rendered, newline-joined).

        ``thread`` is the reply chain the new message answers (nearest first, already older
        than the window): it goes in first, and its words join the query, so a reply such as
        "explain that" brings back what it replies to and what that was about.
        ``weight`` maps the best ranked score to the share (0-1) of the budget the ranked turns
        may take (at least ``floor`` tokens when the share is above 0); ``skip`` leaves out
        turns the prompt already holds. ``relative``: when the best turn holds every word of the
        query (a complete match, ``COMPLETE_MATCH``), ranked turns scoring under that share of
        its score are left out (their partners may still come with a kept turn): the answer is
        there, and a wide net only costs tokens; a partial match keeps the wide net (measured,
        docs/memory.md "Recall that answers"). ``spare_tokens``: room a short window left
        beyond ``budget_tokens``; a partial match's net spans it, and after a complete match's
        cut or a weak match (``weight`` 0) it takes the next-best turns that hold at least
        ``min_score`` of the query's word weight themselves (never ones that only borrow from
        a neighbour), after the others and their partners (``RetrievedBlock.core`` counts
        the turns before them: a recall note never holds them). An older message that
        repeats the query (``is_repeat``) and the answers to it are never recalled.
        """
        cfg = self._config
        if not cfg.enabled or budget_tokens <= 0 or cfg.max_turns == 0:
            return RetrievedBlock()
        packer = _Packer(self._counter, budget_tokens, skip=skip)
        for msg in thread[: cfg.max_turns]:
            packer.add(msg, "in the reply thread being answered")
        if thread:
            query = " ".join([query, *(m.text for m in thread[:2])])
        ranked, outline, span = await self.rank(conversation, query, before_id=before_id)
        if not ranked:
            return packer.block()
        terms = query_terms(query)
        packer.skip = lambda m: is_repeat(m.text, terms) or (skip is not None and skip(m))
        complete = ranked[0].words >= COMPLETE_MATCH
        chosen = ranked
        if relative > 0 and complete:
            chosen = [r for r in ranked if r.score >= relative * ranked[0].score]
        scaled = budget_tokens
        if weight is not None:
            share = weight(ranked[0].score)
            scaled = max(int(budget_tokens * share), floor) if share > 0 else 0
            scaled = min(budget_tokens, packer.used + scaled)
        places = {r.id: place for place, r in enumerate(ranked, start=1)}
        wide = not complete and scaled > packer.used  # a partial match: the net spans the room
        packer.budget = scaled + (spare_tokens if wide else 0)
        if scaled > packer.used:
            await self._pack(packer, chosen, outline, span, places)
        core = len(packer.chosen)
        if spare_tokens > 0 and not wide and len(packer.chosen) < cfg.max_turns:
            # The room a short window left, after a complete match's cut or a weak match: the
            # next-best turns that match on their own words (not only by borrowing).
            packer.budget = max(scaled, packer.used) + spare_tokens
            more = [r for r in ranked if r.id not in packer.reasons and r.words >= cfg.min_score]
            await self._pack(packer, more, outline, span, places)
        return packer.block(core=core)

    async def _pack(
        self,
        packer: _Packer,
        ranked: Sequence[Ranked],
        outline: Outline,
        span: tuple[int, int],
        places: Mapping[int, int],
    ) -> None:
        """Add ranked turns best first, then the question/answer partners of what was added,
        while they fit the packer's budget and ``max_turns``."""
        cfg = self._config
        budget_tokens = packer.budget - packer.used
        # Read the text of only as many hits as can fit (the outline knows their stored token
        # counts; twice the budget leaves room for a counter that counts differently).
        pool: list[int] = []
        expected = 0
        for r in ranked:
            if expected > 2 * budget_tokens:
                break
            pool.append(r.id)
            at = outline.index(r.id)  # ranked ids come from this outline
            expected += (outline.tokens[at] if at is not None else 0) + 1
        ranked = ranked[: len(pool)]
        pool += partners(outline, pool[: cfg.max_turns], span=span)
        by_id = {m.id: m for m in await self._store.messages_by_ids(pool)}
        for r in ranked:
            if len(packer.chosen) >= cfg.max_turns:
                break
            if r.id in by_id:
                packer.add(by_id[r.id], f"ranked #{places[r.id]}, score {r.score:.3f}")
        if len(packer.chosen) < cfg.max_turns:
            for mid in partners(outline, [m.id for m in packer.chosen], span=span):
                if mid in by_id and len(packer.chosen) < cfg.max_turns:
                    packer.add(by_id[mid], "question/answer partner of a retrieved turn")


class _Packer:
    """Whole turns under a token budget; a day's date line is paid for by its first turn."""

    def __init__(
        self,
        counter: TokenCounter,
        budget: int,
        *,
        skip: Callable[[StoredMessage], bool] | None = None,
    ) -> None:
        self._counter = counter
        self.budget = budget
        self.skip = skip
        self._days: set[str] = set()
        self.chosen: list[StoredMessage] = []
        self.reasons: dict[int, str] = {}
        self.used = 0

    def add(self, message: StoredMessage, reason: str) -> bool:
        if message.id in self.reasons or (self.skip is not None and self.skip(message)):
            return False
        day = day_label(message.created_at)
        cost = self._counter.count(render_turn(message)) + 1
        if day not in self._days:
            cost += self._counter.count(day) + 1
        if self.used + cost > self.budget:
            return False  # a smaller, lower-ranked turn may still fit
        self._days.add(day)
        self.chosen.append(message)
        self.reasons[message.id] = reason
        self.used += cost
        return True

    def block(self, *, core: int | None = None) -> RetrievedBlock:
        turns = sorted(self.chosen, key=lambda m: m.id)
        lines: list[str] = []
        last_day = None
        for msg in turns:
            day = day_label(msg.created_at)
            if day != last_day:
                lines.append(day)
                last_day = day
            lines.append(render_turn(msg))
        return RetrievedBlock(
            turns=turns,
            lines=lines,
            tokens=self.used,
            reasons=self.reasons,
            order=list(self.chosen),
            core=core,
            budget=self.budget,
        )
