"""Retrieval of older turns relevant to a new message, from this conversation only.

Invariants:
- Queries are an OR of quoted, stopword-free content words of the message: FTS5's default
  implicit AND finds nothing for almost every question, and quoting makes FTS5 syntax in the
  message (``"``, ``*``, ``NEAR(``, ``OR``, ``col:``) plain text.
- Search is scoped to one conversation and to messages after its reset mark and before the
  recent window (a rowid range, see ``schema``), so other people's history never costs time
  and never appears.
- Hits below ``min_score`` are dropped: a question with nothing relevant gets an empty block and
  its budget goes to the recent window.
- The block is packed best-first under the budget, whole turns only, and rendered in
  chronological order with each turn's date and speaker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bot.config import RetrievalConfig
from bot.llm.tokens import TokenCounter
from bot.memory.store import Conversation, SqliteStore, StoredMessage

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


def build_match(text: str) -> str | None:
    """An FTS5 MATCH expression: an OR of quoted terms, or None when nothing is searchable."""
    terms = query_terms(text)
    if not terms:
        return None
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def render_turn(message: StoredMessage) -> str:
    when = datetime.fromtimestamp(message.created_at, UTC)
    return f"[{when.day} {when:%b %Y}] {message.author}: {message.text}"


@dataclass(frozen=True, slots=True)
class RetrievedBlock:
    turns: list[StoredMessage] = field(default_factory=list)  # chronological
    lines: list[str] = field(default_factory=list)
    tokens: int = 0

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class Retriever:
    def __init__(
        self, *, store: SqliteStore, counter: TokenCounter, config: RetrievalConfig
    ) -> None:
        self._store = store
        self._counter = counter
        self._config = config

    async def retrieve(
        self,
        conversation: Conversation,
        query: str,
        *,
        budget_tokens: int,
        before_id: int,
    ) -> RetrievedBlock:
        """Best older turns for ``query`` that fit ``budget_tokens`` (rendered, newline-joined)."""
        if not self._config.enabled or budget_tokens <= 0 or self._config.max_turns == 0:
            return RetrievedBlock()
        match = build_match(query)
        if match is None:
            return RetrievedBlock()
        hits = await self._store.fts_search(
            conversation.id,
            match,
            after_id=conversation.reset_after,
            before_id=before_id,
            limit=max(4 * self._config.max_turns, 20),
        )
        hits = [(mid, score) for mid, score in hits if score > self._config.min_score]
        if not hits:
            return RetrievedBlock()
        by_id = {m.id: m for m in await self._store.messages_by_ids([mid for mid, _ in hits])}
        chosen: list[tuple[StoredMessage, str, int]] = []
        used = 0
        for mid, _score in hits:
            msg = by_id.get(mid)
            if msg is None:
                continue
            line = render_turn(msg)
            cost = self._counter.count(line) + 1
            if used + cost > budget_tokens:
                continue  # a smaller, lower-ranked turn may still fit
            chosen.append((msg, line, cost))
            used += cost
            if len(chosen) >= self._config.max_turns:
                break
        chosen.sort(key=lambda item: item[0].id)
        return RetrievedBlock(
            turns=[c[0] for c in chosen], lines=[c[1] for c in chosen], tokens=used
        )
