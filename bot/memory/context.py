"""Context assembly under a per-transport token budget, laid out so the prompt only grows.

Layout (one message per line; on a one-slot llama.cpp/Ollama server everything up to the
first byte that differs from the previous request is reused from the KV cache):

    system   system prompt + the transport's style hint
             + pinned facts that are older than the window ("stable" facts)
             + summary chapters, oldest first
    window   user/assistant turns since the last fold, verbatim, strictly alternating, with
             date lines where the person's day changes (``bot.memory.window``)
    final    [facts added since the window began] [recall note: the best recalled turns]
             [more recalled turns, this once] [its date line, on a new day] the new message

The fold rule (what keeps the prefix stable):
- The window starts right after the newest summary chapter (or the reset mark) and is cut only
  at *fold points*: walking the turns from that base, each fold point lies past a block of at
  least ``FOLD_SHARE`` of the window's cap, counted once a turn follows the block. The window
  starts at the first fold point from which the turns fit the cap. Fold points depend only on
  the log after the base, the budget and the chapters (which change only at a fold), never on
  the new message, retrieval or facts, so between two folds each request is a byte-identical
  extension of the previous one up to the end of its window. Only when even the whole window
  without a complete block leaves no room does it drop its oldest turns (a small budget).
- A fold moves a large block of the oldest turns out of the window at once. The summarizer
  writes that block as a new chapter appended after the earlier ones (so the prefix up to the
  last chapter survives), and the base moves to the end of the chapter: the same fold point.
  Until the chapter exists the window keeps those turns (``pending_fold``), as long as the
  whole prompt still fits, so the prompt changes once per fold, not twice.
- Facts added after the window began ride in the final message until the next fold, where they
  join the system message.
- Retrieved older turns (only turns older than the window) go in the final message, right
  before the new message (``recall="inline"``: all of them, this once), or (``"notes"``, the
  default, measured better by ``bench.prefix``) their best part (``NOTE_SHARE`` of the free
  budget, at least ``MIN_RECALL_TOKENS``) leads the final message and is stored with that
  message (``save_recall_note``) as its note, shown with it again until it folds, and the rest
  (``MORE_HEADER``) follows the note this once. The next request starts that message with the
  same note, so a cache keeps the note; the rest costs only this prompt's tail (re-read anyway
  on the next turn), not the window's room, so it does not bring folds closer. The rest is a
  pure function of the store and the message, so a restart sends the same prompt. A note
  counts in its turn's cost (fold points included).
- How much a message recalls (``recall_weight``): up to ``retrieval.share`` of the free budget
  (and never more than the budget has left) for a message that matches older turns strongly
  (it asks about the past), scaled down linearly to nothing between ``STRONG_MATCH`` and
  ``WEAK_MATCH`` (small talk: its turns stay cache-cheap). An older message that repeats the
  new one (``retrieval.is_repeat``: a greeting, a phrase said again) and the answers to it
  neither count as a match nor are recalled. When one older turn holds every word of the
  message (a complete match), only the ranked turns scoring at least ``RELATIVE_SCORE`` of it
  come (and their question/answer partners); a partial match casts the wide net, up to the
  budget. A turn already in the window, in a note in the window, or in a pinned fact is not
  recalled again. On a slow server (``recall_room``: the learned prompt speed times
  ``retrieval.recall_seconds``) everything recalled this turn, the older chapter included, is
  also held to what the server reads in those seconds (never under ``MIN_RECALL_TOKENS``).

Invariants:
- The assembled prompt never exceeds the budget as counted by the injected counter (each
  part's tokens plus per-message and per-join overheads are summed conservatively).
- History turns are never split: a turn is a run of user messages with the assistant messages
  that answered them; the window holds whole turns and is contiguous up to the new message.
- Nothing before the conversation's reset mark is used (store queries are bounded by it).
- A reply to an older message (Discord reply, ``parent_id``) brings its reply chain (up to
  ``THREAD_HOPS``, after the reset mark, older than the window) into the recalled turns first.
- Only the new message may be cut (a 100 KB paste); the stored copy stays whole, and
  ``trimmed`` tells the responder to say so. Chapters or facts that do not fit their share
  are left out (oldest first) without blaming the message.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol

from bot.llm.port import ChatMessage, merge_system
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter, prefix_within
from bot.memory.facts import INFERRED_TOKENS, fact_line
from bot.memory.older_chapter import CHAPTER_SESSIONS, NOTE_END, older_chapter
from bot.memory.port_derived import Derived, SessionLog
from bot.memory.port_log import ConversationLog
from bot.memory.port_recall import Recall
from bot.memory.reads import at_once
from bot.memory.records import Session
from bot.memory.retrieval import RetrievedBlock, Retriever
from bot.memory.store import Conversation, Fact, StoredMessage, Summary
from bot.memory.window import (
    FOLD_SHARE,
    anchor,
    date_cost,
    date_lines,
    day_line,
    fold_start,
    group_turns,
    join_final,
    last_day,
    render,
    squeeze_point,
    turn_costs,
)
from bot.text import fill_prompt

# Says exactly whose each note is (bot.memory.facts.fact_line marks the inferred ones).
FACTS_HEADER = (
    "Notes about this person (a plain line: they asked you to remember it; a line marked "
    "inferred: you inferred it from your chats, they did not ask):"
)
NEW_FACTS_HEADER = (
    "(New notes about this person (a plain line: they asked you to remember it; a line marked "
    "inferred: they did not ask):"
)


class ContextStore(ConversationLog, Derived, SessionLog, Recall, Protocol):
    """What a prompt is built from."""


SUMMARY_HEADER = "Summary of the earlier conversation:"
RETRIEVED_HEADER = "(Earlier messages that may be relevant, dated:"
MORE_HEADER = "(More earlier messages that may be relevant to the new message, dated:"
JOIN_OVERHEAD = 2  # tokens a "\n\n" join and header line break may add
MIN_NEW_MESSAGE_TOKENS = 16
FACTS_MAX_SHARE = 0.15  # of the budget left after the system prompt
SUMMARY_MAX_SHARE = 0.25
MIN_CHAPTER_CUT = 16  # tokens: a newest chapter over its share is cut to it, if this much fits
MIN_WINDOW_SHARE = 0.1  # the window's cap: (1 - retrieval.share) of what chapters leave, >= this
FOLD_MARGIN = 16  # tokens a held window leaves spare (joins; recall may get nothing that turn)
FETCH_ANCHOR = 500  # a lagging summarizer: fold points restart every this many messages
THREAD_HOPS = 4  # how far up a reply chain the context follows (answer, question, ...)
MIN_RECALL_TOKENS = 64  # small budgets still recall a turn or two for a strong match
NOTE_SHARE = 0.03  # of the free budget (at least MIN_RECALL_TOKENS): a recall kept as its note
RELATIVE_SCORE = 0.7  # after a complete match, ranked turns under this share of its score are not
# Best retrieval score (share of the query's rare-word weight) at or above which a message gets
# its whole recall budget, at or below which none (LoCoMo, bench.memory_e2e: 86% of questions
# about the past reach 0.5, 20% of conversational lines do; 97% / 48% reach 0.3).
STRONG_MATCH = 0.5
WEAK_MATCH = 0.25
LATE_ANSWERS = 16  # answers stored after the message being answered that may belong before it

RecallMode = Literal["inline", "notes"]
# (folded_up_to, newest chapter's written time) -> the long-term block as shown, or ""
LongtermRead = Callable[[int, float | None], Awaitable[str]]
__all__ = [
    "FOLD_SHARE",
    "AssembledContext",
    "Block",
    "ContextBuilder",
    "fold_start",
    "group_turns",
    "merge_system",
]


@dataclass(frozen=True, slots=True)
class _Reads:
    """``ContextBuilder._reads``: what a prompt reads first, at once."""

    chapters: list[Summary]
    facts: list[Fact]
    sessions: list[Session]
    late: list[StoredMessage]
    chain: list[StoredMessage]
    longterm: bool
    new_at: float | None  # when the new message was stored (its date line)


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    tokens: int
    text: str


@dataclass(frozen=True, slots=True)
class AssembledContext:
    messages: list[ChatMessage]
    blocks: list[Block]
    tokens: int
    budget: int
    window: list[StoredMessage] = field(default_factory=list)
    retrieved: list[StoredMessage] = field(default_factory=list)
    retrieved_reasons: dict[int, str] = field(default_factory=dict)  # id -> why (memory show)
    trimmed: bool = False  # the new message had to be cut
    chapters: list[Summary] = field(default_factory=list)  # the summary chapters used
    folded_up_to: int = 0  # last message id before the window (chapter end or reset mark)
    pending_fold: int | None = None  # first message the window keeps once its fold is written
    folded: bool = False  # turns since ``folded_up_to`` were left out of the window
    reserved: int = 0  # tokens held back for the long-term summary (``longterm_reserve``)
    longterm_text: str = ""  # what ``longterm`` rendered for the reserve (counted in it)

    @property
    def window_start_id(self) -> int | None:
        """Where the window starts once its pending fold has a chapter: the summarizer writes
        everything before this id. None when there is nothing to write: the window holds
        every turn since the last chapter and no fold is pending."""
        if self.pending_fold is not None:
            return self.pending_fold
        if not self.folded:
            return None
        return self.window[0].id if self.window else None


def recall_weight(score: float) -> float:
    """Share (0-1) of the recall budget a message whose best older turn scores ``score`` gets."""
    return min(1.0, max(0.0, (score - WEAK_MATCH) / (STRONG_MATCH - WEAK_MATCH)))


class ContextBuilder:
    def __init__(
        self,
        *,
        store: ContextStore,
        retriever: Retriever,
        counter: TokenCounter,
        system_prompt: str,
        retrieval_share: float,
        recall: RecallMode = "notes",
        min_fold_messages: int = 6,
        wall: Callable[[], float] = time.time,
        recall_room: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._store = store
        # Tokens a reply's recall may add (the server's learned prompt speed times
        # ``retrieval.recall_seconds``); None: no limit but the budget.
        self._recall_room = recall_room
        self._wall = wall  # the date ``{date}`` in the system prompt says
        self._retriever = retriever
        self._counter = counter
        self._system_prompt = system_prompt
        self._share = retrieval_share
        self._min_fold_turns = max(1, (min_fold_messages + 1) // 2)  # summary.min_evicted
        self.recall: RecallMode = recall
        # The most a date line costs (``[28 Sep 2026]``: day, month and year tokens vary).
        self._date_allowance = max(
            counter.count(day_line(86400 * d)) + 1 for d in range(0, 366 * 60, 7)
        )
        self._header_tokens = {
            h: counter.count(h) + JOIN_OVERHEAD
            for h in (FACTS_HEADER, NEW_FACTS_HEADER, SUMMARY_HEADER, RETRIEVED_HEADER, MORE_HEADER)
        }

    async def build(
        self,
        conversation: Conversation,
        *,
        new_text: str,
        new_message_id: int | None,
        budget: int,
        style_hint: str = "",
        longterm_reserve: int = 0,
        longterm: LongtermRead | None = None,
        speaker: str | None = None,
        system_prompt: str | None = None,
    ) -> AssembledContext:
        """``longterm_reserve``: tokens to hold back from ``budget`` when the conversation
        has a long-term summary (read with the rest, ``_reads``); ``reserved`` says if.
        ``longterm`` renders the version shown as of the window's base and the newest
        chapter (``LayeredContext``): the part of the reserve it leaves unused goes to the
        once-only tail (recall's room, the older chapter), never to the window's cap or the
        note's size, so the fold points stay where the constant reserve puts them.
        ``speaker`` (a shared channel that names its speakers, Discord): the new message is
        shown as ``speaker: text`` and every user message of the window as ``author: text``
        (the author stored with it, so an earlier turn reads the same in every prompt)."""
        named = speaker is not None
        trimmed = False
        # ``system_prompt``: a persona chosen for this conversation (bot.chat_settings)
        now = datetime.fromtimestamp(self._wall(), UTC)
        prompt = fill_prompt(system_prompt or self._system_prompt, now)
        system = f"{prompt} {style_hint}".strip()
        system_tokens = self._counter.count(system) + MESSAGE_OVERHEAD
        reads = await self._reads(conversation, new_message_id, longterm=longterm_reserve > 0)
        reserved = longterm_reserve if reads.longterm else 0
        budget -= reserved
        free = budget - system_tokens
        if free < MIN_NEW_MESSAGE_TOKENS + MESSAGE_OVERHEAD:
            raise ValueError(f"budget {budget} cannot hold the system prompt and a message")
        chapters, chapter_text, chapter_tokens = self._chapters(reads.chapters, free)
        # Chapters change only at a fold, so the cap (and the fold points) stay put between.
        # The rest of the cap (retrieval.share) is kept for the new message, facts and recall.
        # (less the date line the window's first turn always shows: a constant, so the fold
        # points do not depend on where the window starts, bot.memory.window)
        window_cap = int((free - chapter_tokens) * max(MIN_WINDOW_SHARE, 1.0 - self._share))
        window_cap = max(1, window_cap - self._date_allowance)
        base = chapters[-1].last_message_id if chapters else conversation.reset_after
        base = max(base, conversation.reset_after)
        turns, notes, fold, anchored = await self._window(
            conversation, base, new_message_id, window_cap, late=reads.late, named=named
        )
        longterm_text, unused = "", 0
        if reserved and longterm is not None:
            longterm_text = await longterm(base, chapters[-1].created_at if chapters else None)
            cost = self._measure(longterm_text) if longterm_text else 0
            if cost > reserved:
                longterm_text, cost = "", 0  # does not fit its reserve: left out
            unused = reserved - cost

        # Facts: the newest that fit their share; those older than the window are stable.
        kept: list[Fact] = []
        fact_tokens = self._header_tokens[FACTS_HEADER]
        for fact in reversed(reads.facts):
            cost = fact.tokens + 2 + (0 if fact.pinned else INFERRED_TOKENS)
            if fact_tokens + cost > int(free * FACTS_MAX_SHARE):
                continue
            kept.insert(0, fact)
            fact_tokens += cost

        # A pending fold waits for its chapter (so the prompt changes once, not twice) while
        # the whole window still leaves room for everything else; then it folds regardless.
        room = free - chapter_tokens - fact_tokens - FOLD_MARGIN
        room -= self._counter.count(new_text) + MESSAGE_OVERHEAD + JOIN_OVERHEAD
        room -= self._counter.count(speaker) + 2 if speaker is not None else 0
        # A new message on another day than the window's last turn opens with its date line,
        # as the window will show it from the next prompt on (bot.memory.window).
        new_day = day_line(self._wall() if reads.new_at is None else reads.new_at)
        new_dated = not turns or last_day(turns) != new_day
        room -= self._counter.count(new_day) + 1 if new_dated else 0
        window_room = room
        # The fold point this turn completes (a block is complete once a turn follows it): its
        # chapter is written right after this answer, so the next prompt changes once (a new
        # chapter and a shorter window) instead of dropping turns before the chapter exists.
        costs = self._costs(turns, notes, named)
        ahead = fold_start([*costs, window_cap + 1], cap=window_cap, min_turns=self._min_fold_turns)
        pending_fold = None
        if 0 < ahead < len(turns):
            pending_fold = turns[ahead][0].id
        elif ahead and ahead == len(turns) and new_message_id is not None and not anchored:
            pending_fold = new_message_id
        dated = date_lines(turns)  # as counted in ``costs``; the window's first turn has one

        def need(start: int) -> int:
            first = turns[start][0]
            return sum(costs[start:]) + (
                0 if first.id in dated else date_cost(first, self._counter)
            )

        if fold and not anchored and need(0) <= room:
            fold = 0
        while fold < len(turns) and need(fold) > room:
            fold += 1  # no complete fold block yet and no room: drop the oldest turns (rare)
        window = turns[fold:]
        folded = anchored or fold > 0
        flat = [m for turn in window for m in turn]
        # Notes recalled earlier in this window stay with their turns (append-only prompt).
        notes = {m.id: notes[m.id] for m in flat if m.id in notes}
        recall_cap = max(int(free * self._share), MIN_RECALL_TOKENS)
        since = flat[0].created_at if flat else float("inf")
        stable = [f for f in kept if f.created_at < since]
        fresh = [f for f in kept if f.created_at >= since]

        blocks = [Block("system", system_tokens, system)]
        if stable:
            text = FACTS_HEADER + "\n" + "\n".join(fact_line(f) for f in stable)
            blocks.append(Block("facts", self._measure(text), text))
        if chapter_text:
            blocks.append(Block("summary", chapter_tokens, chapter_text))
        system_text = "\n\n".join(b.text for b in blocks)
        messages = [ChatMessage("system", system_text)]
        dates = date_lines(window)
        window_msgs = render(flat, notes=notes, dates=dates, named=named)
        window_tokens = sum(self._counter.count(m.content) + MESSAGE_OVERHEAD for m in window_msgs)
        blocks.append(Block("window", window_tokens, f"{len(flat)} messages"))
        fixed = sum(b.tokens for b in blocks) + JOIN_OVERHEAD * len(blocks)
        left = budget - fixed + unused  # the tail may use what the long-term block leaves

        # The final message: new facts, recalled turns, then the new message (cut to fit).
        extras: list[str] = []
        fresh_text = ""
        if fresh:
            noted_text = " ".join(notes.values())
            lines = [fact_line(f) for f in fresh if f.text not in noted_text]
            if lines:
                fresh_text = NEW_FACTS_HEADER + "\n" + "\n".join(lines) + NOTE_END
                extras.append(fresh_text)
        extra_tokens = self._measure(fresh_text) if fresh_text else 0
        said = f"{speaker}: " if speaker is not None else ""
        if not window or last_day(window) != new_day:
            said = f"{new_day}\n{said}"
        new_tokens = self._counter.count(said + new_text) + MESSAGE_OVERHEAD + JOIN_OVERHEAD
        room = left - extra_tokens
        if new_tokens > room:
            keep = room - MESSAGE_OVERHEAD - JOIN_OVERHEAD - 4 - self._counter.count(said)
            new_text = prefix_within(self._counter, new_text, max(keep, 0))
            new_text += " […]"
            new_tokens = self._counter.count(said + new_text) + MESSAGE_OVERHEAD + JOIN_OVERHEAD
            trimmed = True
        left -= extra_tokens + new_tokens

        block = RetrievedBlock()
        headers = self._header_tokens[RETRIEVED_HEADER]
        if self.recall == "notes":
            headers += self._header_tokens[MORE_HEADER]
        # Recall may also take what the window leaves unused (a short window: after a restart,
        # a fold, a new person with a long history): a partial match's net spans it; after a
        # complete match's cut or a weak match only turns matching on their own words fill it
        # (``Retriever.retrieve``). It is the transient tail, never the note.
        # (at least MIN_RECALL_TOKENS of turns, headers aside: a small budget still recalls)
        retrieve_budget = min(left - headers, max(recall_cap - headers, MIN_RECALL_TOKENS))
        spare = max(0, left - headers - retrieve_budget)
        # What the server reads for recall this once is what the person waits for: on a slow
        # server recall takes only what it evaluates in ``recall_seconds`` (at least a turn or
        # two), the spare room last.
        limit = self._recall_room()
        tight = limit is not None and max(limit, MIN_RECALL_TOKENS) < retrieve_budget + spare
        if limit is not None:
            limit = max(limit, MIN_RECALL_TOKENS)
            retrieve_budget = min(retrieve_budget, limit)
            spare = min(spare, max(0, limit - retrieve_budget))
        older = folded or base > conversation.reset_after  # anything older than the window
        if retrieve_budget > 0 and older:
            before = flat[0].id if flat else (new_message_id or 1 << 62)
            thread: list[StoredMessage] = []
            if new_message_id is not None:  # a reply: the chain it answers, if out of the window
                thread = [m for m in reads.chain if conversation.reset_after < m.id < before]
            # Not again what the prompt already holds: notes of this window, pinned facts.
            seen = "\n".join([*notes.values(), *(f.text for f in kept)])
            block = await self._retriever.retrieve(
                conversation,
                new_text,
                budget_tokens=retrieve_budget,
                before_id=before,
                thread=thread,
                weight=recall_weight,
                floor=MIN_RECALL_TOKENS,
                skip=(lambda m: m.text in seen) if seen else None,
                relative=RELATIVE_SCORE,
                spare_tokens=spare,
            )
        tail: list[Block] = []
        if fresh_text:
            tail.append(Block("new facts", extra_tokens, fresh_text))
        # Notes: the best part of the recall (``NOTE_SHARE``) stays with this turn and leads
        # the final message; the rest follows it and is shown this once (the tail of the
        # prompt, re-read anyway). Next turn the message starts with the same note, so the
        # cache keeps it, and the turn's cost in the window (hence the folds) grows only by it.
        held, rest = block, RetrievedBlock()
        if self.recall == "notes" and block.turns:
            cap = max(int(free * NOTE_SHARE), MIN_RECALL_TOKENS) if NOTE_SHARE > 0 else 0
            # A room that holds recall back shows all it chose; else what it used (bench.prefix)
            held, rest = block.split(self._counter, cap, room=left - headers if tight else None)
        if held.turns:
            text = f"{RETRIEVED_HEADER}\n{held.text}{NOTE_END}"
            extras.append(text)
            tail.append(
                Block("retrieved", held.tokens + self._header_tokens[RETRIEVED_HEADER], text)
            )
        if rest.turns:
            text = f"{MORE_HEADER}\n{rest.text}{NOTE_END}"
            tail.append(
                Block("retrieved, once", rest.tokens + self._header_tokens[MORE_HEADER], text)
            )
        note = "\n\n".join(extras)
        if self.recall == "notes" and new_message_id is not None:  # "" clears a retried one
            quoted = [m.id for m in held.turns]
            await self._store.save_recall_note(new_message_id, note, quoted)
        if rest.turns:
            extras.append(tail[-1].text)
            note = "\n\n".join(extras)
        # Budget still free after recall: the older session summary that best matches the
        # message (the system block's chapters stay as they are), this once, like the rest.
        recalled = sum(b.tokens for b in tail if b.name.startswith("retrieved"))
        room = left - recalled
        if limit is not None:
            room = min(room, limit - recalled)
        if older and room >= MIN_RECALL_TOKENS:
            before = flat[0].id if flat else (new_message_id or 1 << 62)
            chapter = older_chapter(conversation, reads.sessions, new_text, before=before)
            if chapter and self._measure(chapter) <= room:
                tail.append(Block("chapter, once", self._measure(chapter), chapter))
                extras.append(chapter)
                note = "\n\n".join(extras)
        if pending_fold is None and not anchored and fold < len(turns):
            # The next window holds this message with its note and answer (a turn like the
            # last ones, plus the note): if that will not fit, fold now.
            noted = held.tokens + self._header_tokens[RETRIEVED_HEADER] if held.turns else 0
            early = squeeze_point(
                costs[fold:],
                room=window_room - max(costs[-2:]) - noted,
                min_turns=self._min_fold_turns,
            )
            if early is not None and fold + early < len(turns):
                pending_fold = turns[fold + early][0].id
            elif early is not None and new_message_id is not None:
                pending_fold = new_message_id  # the whole window folds
        final = f"{note}\n\n{said}{new_text}" if note else said + new_text
        messages.extend(join_final(window_msgs, final))
        tail.append(Block("new", new_tokens, new_text))
        blocks.extend(tail)
        total = fixed + sum(b.tokens for b in blocks[len(blocks) - len(tail) :])
        return AssembledContext(
            messages=messages,
            blocks=blocks,
            tokens=total,
            budget=budget,
            window=flat,
            retrieved=list(block.turns),
            retrieved_reasons=dict(block.reasons),
            trimmed=trimmed,
            chapters=chapters,
            folded_up_to=base,
            pending_fold=pending_fold,
            folded=folded,
            reserved=reserved,
            longterm_text=longterm_text,
        )

    async def _reads(
        self, conversation: Conversation, new_message_id: int | None, *, longterm: bool
    ) -> _Reads:
        """What the prompt reads that depends on nothing else read, at once (``at_once``):
        chapters, facts, the late answers and a reply's chain (both for a stored message),
        the sessions the older chapter is chosen from, and (``longterm``) whether there is a
        long-term summary."""
        store = self._store
        async with at_once() as reads:
            has_longterm = (
                reads.create_task(store.has_longterm_summary(conversation.id)) if longterm else None
            )
            chapters = reads.create_task(store.summaries(conversation))
            facts = reads.create_task(store.facts(conversation.id))
            sessions = reads.create_task(store.sessions(conversation.id, limit=CHAPTER_SESSIONS))
            late = chain = new = None
            if new_message_id is not None:  # answers stored after it to ones before it
                newest = store.recent_messages(
                    conversation, limit=LATE_ANSWERS, before_id=new_message_id
                )
                late = reads.create_task(newest)
                chain = reads.create_task(store.ancestors(new_message_id, limit=THREAD_HOPS))
                new = reads.create_task(store.messages_by_ids([new_message_id]))
        stored = new.result() if new is not None else []
        return _Reads(
            chapters=chapters.result(),
            facts=facts.result(),
            sessions=sessions.result(),
            late=late.result() if late is not None else [],
            chain=chain.result() if chain is not None else [],
            longterm=has_longterm.result() if has_longterm is not None else False,
            new_at=stored[0].created_at if stored else None,
        )

    async def _window(
        self,
        conversation: Conversation,
        base: int,
        new_message_id: int | None,
        cap: int,
        *,
        late: Sequence[StoredMessage],
        named: bool = False,
    ) -> tuple[list[list[StoredMessage]], dict[int, str], int, bool]:
        """Turns since the base, their stored recall notes, the index of the fold point the
        window starts at, and whether the turns were re-anchored (older ones since the base
        left out). ``late``: the newest messages before the new one, for answers stored after
        it to questions before it."""
        up_to = (new_message_id - 1) if new_message_id is not None else 1 << 62
        notes: dict[int, str] = {}
        if self.recall == "notes":  # the messages and their notes in one read
            msgs, notes = await self._store.messages_with_notes(
                conversation.id, after_id=base, up_to_id=up_to
            )
        else:
            msgs = await self._store.messages_between(
                conversation.id, after_id=base, up_to_id=up_to
            )
        msgs += [m for m in late if m.id > up_to and base < (m.parent_id or 0)]
        # Each answer right after its question, so a late answer keeps the order stable.
        msgs.sort(key=lambda m: (anchor(m), m.id))
        anchored = len(msgs) > 2 * FETCH_ANCHOR
        if anchored:  # summaries far behind (or off): a nearer anchor keeps this cheap
            msgs = msgs[(len(msgs) // FETCH_ANCHOR - 1) * FETCH_ANCHOR :]
        turns = group_turns(msgs)
        if anchored:
            kept = {m.id for m in msgs}
            notes = {i: note for i, note in notes.items() if i in kept}
        costs = self._costs(turns, notes, named)
        return turns, notes, fold_start(costs, cap=cap, min_turns=self._min_fold_turns), anchored

    def _costs(
        self, turns: Sequence[Sequence[StoredMessage]], notes: dict[int, str], named: bool
    ) -> list[int]:
        return turn_costs(turns, notes, counter=self._counter, measure=self._measure, named=named)

    def _chapters(self, chapters: list[Summary], free: int) -> tuple[list[Summary], str, int]:
        """The newest chapters that fit their share, oldest first, and their rendered text.
        The newest chapter is shown even when it alone is over the share, cut to it with a
        visible "[…]": the window starts after it, so leaving it out would leave its turns
        in neither (a small budget, a long merged chapter)."""
        cap = int(free * SUMMARY_MAX_SHARE)
        used = self._header_tokens[SUMMARY_HEADER]
        kept: list[Summary] = []
        texts: list[str] = []
        for chapter in reversed(chapters):
            cost = chapter.tokens + JOIN_OVERHEAD
            if used + cost > cap:
                if not kept and cap - used - JOIN_OVERHEAD >= MIN_CHAPTER_CUT:
                    text = (
                        prefix_within(self._counter, chapter.text, cap - used - JOIN_OVERHEAD - 4)
                        + " […]"
                    )
                    kept, texts = [chapter], [text]
                    used += self._counter.count(text) + JOIN_OVERHEAD
                break
            kept.insert(0, chapter)
            texts.insert(0, chapter.text)
            used += cost
        if not kept:
            return [], "", 0
        return kept, SUMMARY_HEADER + "\n" + "\n\n".join(texts), used

    def _measure(self, text: str) -> int:
        return self._counter.count(text) + JOIN_OVERHEAD
