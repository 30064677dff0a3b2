"""Summary chapters: each fold of the context window becomes one chapter, appended.
(What a chapter is asked with and made of, prompts and input, is ``bot.memory.chapter_text``.)

The context builder (``bot.memory.context``) folds a large block of the oldest window turns at
once; this module writes that block as a chapter covering exactly those messages, after the
earlier chapters, so the prompt prefix up to the last chapter survives the fold. When the
chapters together outgrow ``MERGE_FACTOR * max_tokens`` they are merged into one (``merge``,
also the entry point for a session's end or an idle person).

Invariants:
- A chapter covers ``first_message_id``..``last_message_id`` of the log, starting right after
  the previous chapter (or the reset mark) and ending on a turn boundary, so the window that
  follows starts with the person speaking; a merge covers the union of the chapters it
  replaces (the store deletes the covered rows in the same transaction).
- Bounded: a chapter's input is at most ``FOLD_INPUT_TOKENS`` of messages (a summarizer that
  fell behind catches up chapter by chapter) and its output at most ``summary.max_tokens``;
  a standalone chapter or a merge also fits the server's learned context (``room``): fewer
  messages or chapters per call, each covering exactly what it read.
- A fold is sent, where it can be, as a *continuation* of the prompt its reply was answered
  from (``FoldBase``: the same messages byte for byte and the answer, then one task message
  at the end), so a one-slot server reuses its cached prefix and evaluates only the task
  message. It can when every message of the block is in that prompt's window (else the
  chapter is asked for on its own, ``CHAPTER_PROMPT``). Whatever varies between two requests
  (the word limit, the "shorter" retry) sits at their end.
- Scheduling (``bot.llm.gate``): a fold runs as a *debt* (``DEBT_TURNS`` after it came due:
  at once) right after the reply that makes it due, in the slot that reply kept (the gate's
  debt lane, never preempted), as a continuation sized to the gap the person leaves plus
  ``DEBT_WAIT``; with no room for even ``MIN_CHAPTER_TOKENS`` it is written without the
  model. The next turn waits for it before building its prompt (``settle``). So every due
  fold completes before the next turn, even on a bot that is never idle. (With
  ``DEBT_TURNS`` > 0 a fold is first tried in the background lane, sized to the free time
  the gate expects, and started only if it fits.)
- Runs in owned tasks (one per conversation at most). A failure keeps the chapters so far and
  is retried after ``retry_seconds``.
- A continuation cut by ``max_tokens`` is kept as it is, up to its last full sentence with a
  visible "[…]" (the fold completes with what it has); one with no text at all becomes the
  digest of the block (``own_lines``: the person's sentences first, verbatim). A standalone
  chapter cut by ``max_tokens`` is asked again shorter; if still cut, it is saved up to its
  last full sentence with a visible "[…]" and a warning. Nothing is dropped silently: the
  log stays the record, and every skip is logged.
- A merge or fold-time fact extraction by the model starts only when the gate expects it to
  fit (never holding up the next fold); what is not read for facts at a fold is read at the
  session's close. The person's plain statements are kept as facts at every fold
  (``FactExtractor.at_fold``, no model call). After a debt fold both run in tasks of their
  own: ``settle`` waits for the chapter, never for background work (which waits for the
  very turn that settles).
- A summary begun before a ``!reset`` is refused by the store at save time.
- Nothing forgotten is sent: before every model call of a fold or a merge (the continuation,
  the standalone chapter, its "shorter" retry, the merge) the conversation is read again
  (``bot.memory.forgotten``); one a ``!forget`` on any gateway deleted meanwhile ends the fold
  quietly (a debug line, no ERROR, no retry). A save that fails because the conversation
  went meanwhile ends the same way. (``!reset``/``!forget`` on this gateway also cancel the
  fold in flight, ``forget``.)
- One summary computation per conversation at a time across gateways sharing the store
  (``claim(SUMMARY_CLAIM)``); the one that lost the claim skips, and the winner's summary is
  what the next turn reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bot.config import SummaryConfig
from bot.errors import LLMUnavailable
from bot.llm.gate import BackgroundPreempted, LLMGate, hold_for_debt
from bot.llm.port import LLM, TRUNCATED_MARK, ChatMessage
from bot.llm.server_limits import Room, no_limit
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter
from bot.memory import chapter_check, grounding
from bot.memory.chapter_text import (
    CHAPTER_PROMPT,
    CONTINUATION_PROMPT,
    FOLD_INPUT_TOKENS,
    LIMIT_LINE,
    LINE_TOKENS,
    MERGE_PROMPT,
    bounded,
    fold_input,
    last_sentence,
    merge_input,
    own_lines,
)
from bot.memory.facts import EXTRACT_TOKENS, FactExtractor
from bot.memory.forgotten import Forgotten, gone, still_there
from bot.memory.port_derived import Derived
from bot.memory.port_log import ConversationLog
from bot.memory.port_work import Claims
from bot.memory.records import SUMMARY_CLAIM
from bot.memory.store import Conversation, StoredMessage


class SummaryStore(ConversationLog, Derived, Claims, Protocol):
    """What summaries read and write."""


log = logging.getLogger("bot.memory.summary")

CHAPTER_WORDS_SHARE = 0.3  # words per chapter = this share of summary.max_tokens
MERGE_FACTOR = 1.5  # chapters merge when together over this many times summary.max_tokens
# Turns a due fold may wait for the background before it runs as a debt. 0: at once, after
# the reply that makes it due (measured best: one turn later, a small budget had already
# dropped the block from the prompt, and that reply's prompt no longer held it to continue).
DEBT_TURNS = 0
DEBT_WAIT = 1.0  # seconds a debt fold may hold the next reply (the gap aside)
SETTLE_LIMIT = 30.0  # real seconds a reply waits for a debt fold at most, whatever its size
DEBT_MAX_SECONDS = 20.0  # the most a debt fold is sized for (a long gap, or none known)
PROMPT_SLACK = 32  # tokens a standalone prompt adds around its parts (headers, template)
DATE_SLACK = 30  # a chapter input's date lines (``_fold_input``): three days, 8-10 tokens each
MIN_CHAPTER_TOKENS = 24  # a fold sized below this is not worth a call
WORDS_PER_TOKEN = 0.7
EXTRACT_SIZE = EXTRACT_TOKENS // 2  # a fold's fact extraction: what it usually writes
UNTIL_WORDS = 8  # words of the first kept message quoted in the continuation task


@dataclass(frozen=True, slots=True)
class FoldBase:
    """The prompt a reply was answered from, with its answer last (``assistant``): a fold
    sent as its continuation (to the reply's ``model``) reuses the server's cached prefix."""

    messages: tuple[ChatMessage, ...]
    first_id: int  # the first message its window holds
    model: str | None = None  # the model the reply asked (None: the configured one)


@dataclass
class FoldStats:
    """Folds over this process's life (benchmarks, tests)."""

    due: int = 0  # folds that came due (a new fold point)
    completed: int = 0  # chapters saved
    continued: int = 0  # of those, written as a continuation
    debts: int = 0  # run in the debt lane
    extractive: int = 0  # debts with no room for the model: a digest, the person first
    late: int = 0  # saved more than two turns after coming due
    settle_waits: list[float] = field(default_factory=list)  # turns waiting for a debt fold


class Summarizer:
    def __init__(
        self,
        *,
        store: SummaryStore,
        llm: LLM,
        counter: TokenCounter,
        config: SummaryConfig,
        clock: Callable[[], float] = time.monotonic,
        extractor: FactExtractor | None = None,
        gate: LLMGate | None = None,
        room: Room = no_limit,
    ) -> None:
        self._room = room  # what one standalone request may hold on the server (learned)
        # With a gate: folds are sized to what it expects to fit, and a fold that found no
        # room in the background runs in its debt lane (``DEBT_TURNS``).
        self._gate = gate
        self._bases: dict[int, FoldBase] = {}
        self._due: dict[int, tuple[int, int]] = {}  # conversation -> (fold point, turns due)
        self._lanes: dict[int, str] = {}
        self._convs: dict[int, Conversation] = {}  # whose each conversation is (``forget``)
        self._written: dict[int, int] = {}  # last message id of the newest chapter saved here
        self.stats = FoldStats()
        self._extractor = extractor  # facts from each folded chapter (issue 21), not only at close
        self._extracting: set[asyncio.Task[object]] = set()
        self._merge_due: dict[int, Conversation] = {}  # merges that did not fit at their fold
        self._store = store
        self._llm = llm
        self._counter = counter
        self._config = config
        self._clock = clock
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._retry_at: dict[int, float] = {}
        self._holding: int | None = None  # whose reply kept a slot for its debt (the gate's)
        self._closed = False

    def maybe_schedule(
        self,
        conversation: Conversation,
        *,
        window_start_id: int | None,
        base: FoldBase | None = None,
    ) -> bool:
        """Start a fold if enough turns left the window (``base``: the reply's prompt and
        answer, for a continuation); never blocks. A fold due for more than ``DEBT_TURNS``
        turns replaces a background attempt still waiting with a debt."""
        cid = conversation.id
        self._convs[cid] = conversation
        if base is not None:
            self._bases[cid] = base
        if not self._config.enabled or self._closed or window_start_id is None:
            self._due.pop(cid, None)
            return False
        if window_start_id - 1 <= self._written.get(cid, 0):
            self._due.pop(cid, None)  # built before its chapter was saved: nothing to write
            self._let_go(cid)
            return False
        point, turns = self._due.get(cid, (window_start_id, 0))
        if point != window_start_id:
            turns = 0  # a new fold point (the last one was written)
        if turns == 0:
            self.stats.due += 1
        self._due[cid] = (window_start_id, turns + 1)
        debt = self._gate is not None and turns + 1 > DEBT_TURNS
        running = self._tasks.get(cid)
        if running is not None:
            if not (debt and self._lanes.get(cid) == "background"):
                self._let_go(cid)
                return False
            running.cancel()  # still waiting for room in the background: it is a debt now
        if self._retry_at.get(cid, 0.0) > self._clock():
            self._let_go(cid)
            return False
        lane = "debt" if debt else "background"
        task = asyncio.create_task(self._guarded(conversation, window_start_id, lane, running))
        self._tasks[cid] = task
        self._lanes[cid] = lane

        def done(t: asyncio.Task[None]) -> None:
            if self._tasks.get(cid) is t:
                self._tasks.pop(cid, None)
                self._lanes.pop(cid, None)

        task.add_done_callback(done)
        return True

    def _let_go(self, conversation_id: int) -> None:
        """No debt call follows for this conversation: the slot its reply kept for one
        (``before_reply``) is let go at once (not one another conversation's reply kept)."""
        if self._gate is not None and self._holding == conversation_id:
            self._holding = None
            self._gate.drop_hold()

    def before_reply(self, conversation_id: int, window_start_id: int | None) -> None:
        """Called with a reply's prompt, before its LLM call: when a debt fold will follow
        this reply, its slot is kept for it (``bot.llm.gate.hold_for_debt``)."""
        if self._gate is None or not self._config.enabled or window_start_id is None:
            return
        if window_start_id - 1 <= self._written.get(conversation_id, 0):
            return
        if self._retry_at.get(conversation_id, 0.0) > self._clock():
            return
        point, turns = self._due.get(conversation_id, (window_start_id, 0))
        if point != window_start_id:
            turns = 0
        if turns + 1 > DEBT_TURNS and conversation_id not in self._tasks:
            self._holding = conversation_id  # the gate keeps one slot at most: the newest
            hold_for_debt()

    async def settle(self, conversation_id: int) -> float:
        """Before a turn builds its prompt: wait for the conversation's debt fold, if one
        runs (sized to end within the gap the person leaves and ``DEBT_WAIT``), so the prompt
        has its chapter and changes once; returns the seconds waited (``stats.settle_waits``)."""
        task = self._tasks.get(conversation_id)
        if task is None or self._lanes.get(conversation_id) != "debt":
            return 0.0
        start = self._clock()
        # Bounded: a debt that cannot get the slot (or hangs) never holds a person for good;
        # the reply then goes on without its chapter and the debt keeps running.
        done, _ = await asyncio.wait({task}, timeout=SETTLE_LIMIT)
        if not done:
            # It holds the slot the reply needs (a debt is never preempted): stop it (closing
            # its request stops the generation) and try the fold again after retry_seconds.
            log.warning("the fold of conversation %d is still running after %.0f s; it is "
                        "stopped and tried again in %.0f s, and the reply goes on without its "
                        "chapter. Fix, if it repeats: a faster model or a second server slot",
                        conversation_id, SETTLE_LIMIT, self._config.retry_seconds)  # fmt: skip
            self._retry_at[conversation_id] = self._clock() + self._config.retry_seconds
            task.cancel()
            await asyncio.wait({task}, timeout=SETTLE_LIMIT)
        waited = self._clock() - start
        self.stats.settle_waits.append(waited)
        return waited

    def forget(self, transport: str, person: str, *, space: str | None = None) -> int:
        """``!reset`` (one space) or ``!forget`` (``space`` None: every space): cancel the
        person's folds in flight (a save would be refused anyway, and nothing said before
        must reach the server once more) and drop the prompts held for continuations and
        the folds' debts. Returns how many folds were cancelled."""
        cancelled = 0
        for cid, conv in list(self._convs.items()):
            key = conv.key
            if key.transport != transport or key.person != person:
                continue
            if space is not None and key.space != space:
                continue
            self._bases.pop(cid, None)
            self._due.pop(cid, None)
            self._merge_due.pop(cid, None)
            task = self._tasks.pop(cid, None)
            self._lanes.pop(cid, None)
            if task is not None:
                task.cancel()
                cancelled += 1
        return cancelled

    async def _guarded(
        self,
        conversation: Conversation,
        window_start_id: int,
        lane: str,
        after: asyncio.Task[None] | None = None,
    ) -> None:
        if after is not None:  # the attempt it replaces lets go of the claim first
            await asyncio.wait({after})
        try:
            await self.refresh(conversation, window_start_id=window_start_id, lane=lane)
        except BackgroundPreempted:
            log.debug("summary for conversation %d preempted by a reply", conversation.id)
        except LLMUnavailable as exc:
            self._retry_at[conversation.id] = self._clock() + self._config.retry_seconds
            log.info("summary for conversation %d postponed: %s", conversation.id, exc)
        except Exception:  # loop boundary: a summary must never take the bot down
            if await gone(self._store, conversation):  # e.g. its save met the !forget: quiet
                log.debug("conversation %d forgotten during its fold", conversation.id)
                return
            self._retry_at[conversation.id] = self._clock() + self._config.retry_seconds
            log.exception("summary for conversation %d failed", conversation.id)
        finally:
            # A debt that wrote nothing (too few messages, another gateway's claim, an
            # error) or wrote without the model never took the slot its reply kept.
            self._let_go(conversation.id)

    async def refresh(
        self, conversation: Conversation, *, window_start_id: int, lane: str = "background"
    ) -> bool:
        """Write the messages between the last chapter and the window as a new chapter (if
        there are at least ``min_evicted``); merge the chapters when they grew too long.
        Gateways sharing one store: only the one holding the claim computes it."""
        async with self._store.claim(SUMMARY_CLAIM, conversation.id) as mine:
            if not mine:
                return False
            try:
                return await self._refresh(conversation, window_start_id=window_start_id, lane=lane)
            except Forgotten:
                log.debug("conversation %d forgotten during its fold", conversation.id)
                return False

    def _lane(self, lane: str) -> LLM:
        if self._gate is None:
            return self._llm
        return self._gate.debt if lane == "debt" else self._gate.background

    def _size(self, messages: Sequence[ChatMessage], lane: str) -> int:
        """Completion tokens for a fold: what the gate expects to fit (the free time it
        expects; a debt also ``DEBT_WAIT``), at most summary.max_tokens; a background fold
        at least MIN_CHAPTER_TOKENS (it waits for a gap that size); a debt with less room
        gets 0 (it is written without the model)."""
        limit = self._config.max_tokens
        if self._gate is None:
            return limit
        seconds = self._gate.expected_free()
        if lane == "debt":  # never preempted: bounded even when no gap is known yet
            seconds = min(seconds, DEBT_MAX_SECONDS) + DEBT_WAIT
        fit = self._gate.fit_tokens(messages, seconds=seconds)
        if fit is None:
            return limit
        if fit < MIN_CHAPTER_TOKENS:
            return 0 if lane == "debt" else MIN_CHAPTER_TOKENS
        return min(limit, fit)

    def _no_call(self, conversation_id: int, pending: list[StoredMessage]) -> str:
        """A debt with no room for the model: the chapter is a digest, the person first (nothing
        waits for it; the slot its reply kept is let go)."""
        self._let_go(conversation_id)
        self.stats.extractive += 1
        log.info("conversation %d: no room for the model at this fold; chapter kept from "
                 "the person's own lines", conversation_id)  # fmt: skip
        words = max(20, int(self._config.max_tokens * CHAPTER_WORDS_SHARE))
        return own_lines(pending, words, self._counter)

    async def _refresh(
        self, conversation: Conversation, *, window_start_id: int, lane: str = "background"
    ) -> bool:
        chapters = await self._store.summaries(conversation)
        after = max(conversation.reset_after, chapters[-1].last_message_id if chapters else 0)
        pending = await self._store.messages_between(
            conversation.id, after_id=after, up_to_id=window_start_id - 1
        )
        if len(pending) < self._config.min_evicted:
            return False
        whole = len(pending)
        pending = bounded(pending, self._counter)
        base = self._bases.get(conversation.id)
        continued = False
        extractive = self.stats.extractive
        words = max(20, int(self._config.max_tokens * CHAPTER_WORDS_SHARE))
        if base is not None and len(pending) == whole and pending[0].id >= base.first_id:
            text = await self._continue(conversation, base, window_start_id, pending, lane)
            continued = text is not None
        if not continued:
            before = chapters[-1].text if chapters else ""
            fixed = self._counter.count(CHAPTER_PROMPT + before) + PROMPT_SLACK + DATE_SLACK
            room, answer = self._room(FOLD_INPUT_TOKENS + fixed, self._config.max_tokens)
            pending = bounded(pending, self._counter, limit=room - fixed)
            material = fold_input(before, pending)
            alone = [ChatMessage("system", CHAPTER_PROMPT), ChatMessage("user", material)]
            if lane == "debt" and self._size(alone, lane) < MIN_CHAPTER_TOKENS:
                text = self._no_call(conversation.id, pending)
            else:
                text = await self._write(
                    CHAPTER_PROMPT,
                    material,
                    words,
                    conversation,
                    llm=self._lane(lane),
                    max_tokens=answer,
                )
        assert text is not None
        text = chapter_check.vet(  # junk (an echoed instruction ...) becomes a digest
            text, instruction=CHAPTER_PROMPT + "\n" + CONTINUATION_PROMPT,
            sources=grounding.lines_of(pending), extra=grounding.dates_of(pending),
            counter=self._counter, limit=chapter_check.words_limit(words, self._config.max_tokens),
        )  # fmt: skip
        saved = await self._store.save_summary(
            conversation.id,
            text=text,
            first_message_id=pending[0].id,
            last_message_id=pending[-1].id,
            tokens=self._counter.count(text),
        )
        self._retry_at.pop(conversation.id, None)
        if not saved:
            return False
        self.stats.completed += 1
        self._written[conversation.id] = pending[-1].id
        self.stats.continued += continued and self.stats.extractive == extractive
        self.stats.debts += lane == "debt"
        point, turns = self._due.get(conversation.id, (0, 0))
        if point == window_start_id:
            self.stats.late += turns > 2  # counted at each reply since it came due
            self._due.pop(conversation.id, None)
        log.debug("conversation %d: chapter up to message %d", conversation.id, pending[-1].id)
        if self._extractor is not None:  # folds are not held up; plain facts need no model
            self._aside(self._extractor.at_fold(conversation.id, pending,
                                                model=self._room_for(EXTRACT_SIZE)))  # fmt: skip
        total = sum(c.tokens for c in chapters) + self._counter.count(text)
        if total > self._config.max_tokens * MERGE_FACTOR:
            self._merge_due.pop(conversation.id, None)
            if not self._room_for(self._config.max_tokens):
                self._merge_due[conversation.id] = conversation  # at the next idle moment
            elif lane == "debt":  # the next turn waits for this task: not for a merge
                self._aside(self._merge_aside(conversation))
            else:
                await self._merge(conversation)
        return True

    async def merge_waiting(self) -> int:
        """Merges that came due at a fold but did not fit then (a slow or never idle server),
        one by one while the gate expects each to fit; called from the session keeper's idle
        tick. Returns how many were merged."""
        merged = 0
        for cid, conversation in list(self._merge_due.items()):
            if self._closed or not self._room_for(self._config.max_tokens):
                break
            self._merge_due.pop(cid, None)
            merged += await self._merge_aside(conversation)
        return merged

    def _aside(self, work: Coroutine[None, None, object]) -> None:
        """Background work started by a fold in a task of its own (``settle`` waits for the
        fold only; ``stop`` and ``wait_quiet`` see these too)."""
        task: asyncio.Task[object] = asyncio.create_task(work)
        self._extracting.add(task)
        task.add_done_callback(self._extracting.discard)

    async def _merge_aside(self, conversation: Conversation) -> bool:
        try:
            return await self.merge(conversation)
        except (LLMUnavailable, BackgroundPreempted) as exc:
            log.info("merge of conversation %d postponed: %s", conversation.id, exc)
            self._merge_due.setdefault(conversation.id, conversation)
        except Exception:  # loop boundary: a merge must never take the bot down
            if await gone(self._store, conversation):  # its save met a !forget: quiet
                log.debug("conversation %d forgotten during its merge", conversation.id)
                return False
            log.exception("merge of conversation %d failed", conversation.id)
        return False

    def _room_for(self, max_tokens: int) -> bool:
        """Whether the gate expects a standalone background call of about this size to fit
        now (no gate: always)."""
        if self._gate is None:
            return True
        probe = [ChatMessage("user", "x" * int(max_tokens * 4 * 3))]  # its prompt: ~3x output
        return self._gate.fits(probe, max_tokens=max_tokens)

    async def _continue(
        self,
        conversation: Conversation,
        base: FoldBase,
        window_start_id: int,
        pending: list[StoredMessage],
        lane: str,
    ) -> str | None:
        """The chapter as a continuation of ``base``; None when the message that starts the
        window is not in the store (then the chapter is asked for on its own)."""
        kept = await self._store.messages_between(
            conversation.id, after_id=window_start_id - 1, up_to_id=window_start_id
        )
        if not kept:
            return None
        until = " ".join(kept[0].text.split()[:UNTIL_WORDS])
        head = [*base.messages, ChatMessage("user", CONTINUATION_PROMPT.format(until=until))]
        tokens = self._size(head, lane)
        if tokens == 0:
            return self._no_call(conversation.id, pending)
        # The reply's prompt, the task and the chapter must fit the server's window at its
        # own count (the room reads ours through the learned token ratio): else on its own.
        held = sum(self._counter.count(m.content) + MESSAGE_OVERHEAD for m in head)
        room, tokens = self._room(held + PROMPT_SLACK, tokens)
        if held + PROMPT_SLACK > room:
            log.debug("conversation %d: a continuation would overflow the server's window; "
                      "the chapter is asked for on its own", conversation.id)  # fmt: skip
            return None
        words = max(10, int(tokens * WORDS_PER_TOKEN))
        task = CONTINUATION_PROMPT.format(until=until) + "\n" + LIMIT_LINE.format(words=words)
        messages = [*base.messages, ChatMessage("user", task)]
        await still_there(self._store, conversation)
        completion = await self._lane(lane).complete(messages, max_tokens=tokens, model=base.model)
        text = completion.text.removesuffix(TRUNCATED_MARK).strip()
        if completion.truncated and text:
            cut = last_sentence(text)
            log.info("conversation %d: chapter cut at %d tokens; kept what it has",
                     conversation.id, tokens)  # fmt: skip
            return (cut or text) + TRUNCATED_MARK
        return text or own_lines(pending, words, self._counter)

    async def merge(self, conversation: Conversation) -> bool:
        """Merge every chapter into one longer-term summary (session end, idle, or too long);
        one gateway at a time, as ``refresh``."""
        async with self._store.claim(SUMMARY_CLAIM, conversation.id) as mine:
            try:
                return mine and await self._merge(conversation)
            except Forgotten:
                log.debug("conversation %d forgotten during its merge", conversation.id)
                return False

    async def _merge(self, conversation: Conversation) -> bool:
        chapters = await self._store.summaries(conversation)
        fixed = self._counter.count(MERGE_PROMPT) + PROMPT_SLACK
        wanted = fixed + sum(c.tokens + LINE_TOKENS for c in chapters)
        room, answer = self._room(wanted, self._config.max_tokens)
        while len(chapters) > 1 and fixed + sum(c.tokens + LINE_TOKENS for c in chapters) > room:
            chapters = chapters[:-1]  # the oldest that fit: the rest merge at a later call
        if len(chapters) < 2:
            return False
        words = max(20, int(answer * 0.6))
        text = await self._write(
            MERGE_PROMPT, merge_input(chapters), words, conversation, max_tokens=answer
        )
        text = chapter_check.vet(
            text, instruction=MERGE_PROMPT, sources=[("", c.text) for c in chapters],
            counter=self._counter, limit=chapter_check.words_limit(words, self._config.max_tokens),
        )  # fmt: skip
        saved = await self._store.save_summary(
            conversation.id,
            text=text,
            first_message_id=chapters[0].first_message_id,
            last_message_id=chapters[-1].last_message_id,
            tokens=self._counter.count(text),
        )
        if saved:
            log.debug("conversation %d: %d chapters merged", conversation.id, len(chapters))
        return saved

    async def _write(
        self,
        instruction: str,
        material: str,
        words: int,
        conversation: Conversation,
        *,
        llm: LLM | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """Ask for a summary of ``words`` words; once more at half if the answer was cut or
        too long; a second cut answer is kept to its last full sentence and marked. The word
        limit closes the request, so the retry re-reads only that line. Before each attempt
        the conversation is read again (``Forgotten``: a ``!forget`` meanwhile)."""
        limit = max_tokens or self._config.max_tokens
        for attempt in range(2):
            await still_there(self._store, conversation)
            prompt = [
                ChatMessage("system", instruction),
                ChatMessage("user", material + "\n\n" + LIMIT_LINE.format(words=words)),
            ]
            completion = await (llm or self._llm).complete(prompt, max_tokens=limit)
            text = completion.text.strip()
            if not completion.truncated and self._counter.count(text) <= limit:
                return text
            log.info("summary cut or too long (attempt %d); asking for a shorter one", attempt + 1)
            words = max(10, words // 2)
        text = last_sentence(text.removesuffix(TRUNCATED_MARK).rstrip())
        log.warning("summary still cut by max_tokens; saved up to its last full sentence")
        return text + TRUNCATED_MARK

    async def stop(self, *, timeout: float = 5.0) -> None:
        self._closed = True
        tasks = [*self._tasks.values(), *self._extracting]
        for task in tasks:
            task.cancel()
        if tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(tasks, timeout=timeout)

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def wait_quiet(self) -> None:
        """Until no summary task runs (benchmarks and tests pacing a conversation)."""
        while self._tasks or self._extracting:
            await asyncio.wait([*self._tasks.values(), *self._extracting])
