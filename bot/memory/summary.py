"""Summary chapters: each fold of the context window becomes one chapter, appended.

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
  fell behind catches up chapter by chapter) and its output at most ``summary.max_tokens``.
- Runs in owned background tasks (one per conversation at most) through the LLM gate's
  background lane: it never delays a reply, and a preempted call (a reply came) is retried at
  the next turn. A failure keeps the chapters so far and is retried after ``retry_seconds``.
- Never saved as complete when cut by ``max_tokens``: it is asked again shorter; if still cut,
  it is saved up to its last full sentence with a visible "[…]" and a warning. Nothing is
  dropped silently: the log stays the record, and every skip is logged.
- A summary begun before a ``!reset`` is refused by the store at save time.
- One summary computation per conversation at a time across gateways sharing the store
  (``claim(SUMMARY_CLAIM)``); the one that lost the claim skips, and the winner's summary is
  what the next turn reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Sequence

from bot.config import SummaryConfig
from bot.errors import LLMUnavailable
from bot.llm.gate import BackgroundPreempted
from bot.llm.port import LLM, TRUNCATED_MARK, ChatMessage
from bot.llm.tokens import TokenCounter
from bot.memory import chapter_check
from bot.memory.facts import FactExtractor
from bot.memory.port import MemoryStore
from bot.memory.records import FACTS_CLAIM, SUMMARY_CLAIM
from bot.memory.store import USER, Conversation, StoredMessage, Summary

log = logging.getLogger("bot.memory.summary")

# What people ask about later is concrete: who, when, where, how many, what was decided. The
# prompts ask for those first and verbatim (a paraphrased date or number cannot be recalled).
CHAPTER_PROMPT = (
    "You summarize one stretch of a chat between a person and an assistant, as a chapter "
    "that follows the earlier ones. In at most {words} words, first keep every name, date, "
    "time, place, number and decision exactly as written, with who said or did it; then "
    "preferences and open questions. Drop small talk and anything the earlier chapters "
    "already say. Write plain sentences, no preamble."
)
MERGE_PROMPT = (
    "Merge these consecutive summary chapters of one chat into a single summary of at most "
    "{words} words. Keep every name, date, time, place, number and decision exactly as "
    "written, with who said or did it; then preferences and open questions. Drop only what "
    "later chapters superseded. Write plain sentences, no preamble."
)
MAX_FOLD_MESSAGES = 60
FOLD_INPUT_TOKENS = 1500
CHAPTER_WORDS_SHARE = 0.3  # words per chapter = this share of summary.max_tokens
MERGE_FACTOR = 1.5  # chapters merge when together over this many times summary.max_tokens
_SENTENCE_END = re.compile(r"[.!?。！？](?=\s|$)")


class Summarizer:
    def __init__(
        self,
        *,
        store: MemoryStore,
        llm: LLM,
        counter: TokenCounter,
        config: SummaryConfig,
        clock: Callable[[], float] = time.monotonic,
        extractor: FactExtractor | None = None,
    ) -> None:
        self._extractor = extractor  # facts from each folded chapter (issue 21), not only at close
        self._extracting: set[asyncio.Task[None]] = set()
        self._store = store
        self._llm = llm
        self._counter = counter
        self._config = config
        self._clock = clock
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._retry_at: dict[int, float] = {}
        self._closed = False

    def maybe_schedule(self, conversation: Conversation, *, window_start_id: int | None) -> bool:
        """Start a background fold if enough turns left the window; never blocks."""
        if not self._config.enabled or self._closed or window_start_id is None:
            return False
        cid = conversation.id
        if cid in self._tasks or self._retry_at.get(cid, 0.0) > self._clock():
            return False
        task = asyncio.create_task(self._guarded(conversation, window_start_id))
        self._tasks[cid] = task
        task.add_done_callback(lambda _t: self._tasks.pop(cid, None))
        return True

    async def _guarded(self, conversation: Conversation, window_start_id: int) -> None:
        try:
            await self.refresh(conversation, window_start_id=window_start_id)
        except BackgroundPreempted:
            log.debug("summary for conversation %d preempted by a reply", conversation.id)
        except LLMUnavailable as exc:
            self._retry_at[conversation.id] = self._clock() + self._config.retry_seconds
            log.info("summary for conversation %d postponed: %s", conversation.id, exc)
        except Exception:  # loop boundary: a summary must never take the bot down
            self._retry_at[conversation.id] = self._clock() + self._config.retry_seconds
            log.exception("summary for conversation %d failed", conversation.id)

    async def refresh(self, conversation: Conversation, *, window_start_id: int) -> bool:
        """Write the messages between the last chapter and the window as a new chapter (if
        there are at least ``min_evicted``); merge the chapters when they grew too long.
        Gateways sharing one store: only the one holding the claim computes it."""
        async with self._store.claim(SUMMARY_CLAIM, conversation.id) as mine:
            if not mine:
                return False
            return await self._refresh(conversation, window_start_id=window_start_id)

    async def _refresh(self, conversation: Conversation, *, window_start_id: int) -> bool:
        chapters = await self._store.summaries(conversation)
        after = max(conversation.reset_after, chapters[-1].last_message_id if chapters else 0)
        pending = await self._store.messages_between(
            conversation.id, after_id=after, up_to_id=window_start_id - 1
        )
        if len(pending) < self._config.min_evicted:
            return False
        pending = _bounded(pending, self._counter)
        words = max(20, int(self._config.max_tokens * CHAPTER_WORDS_SHARE))
        before = chapters[-1].text if chapters else ""
        text = await self._write(CHAPTER_PROMPT, _fold_input(before, pending), words)
        text = chapter_check.vet(  # junk (an echoed instruction ...) becomes a digest
            text, instruction=CHAPTER_PROMPT, sources=[(m.author, m.text) for m in pending],
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
        log.debug("conversation %d: chapter up to message %d", conversation.id, pending[-1].id)
        if self._extractor is not None:  # its own task: folds are not held up by it
            task = asyncio.create_task(self._extract_fold(conversation.id, pending))
            self._extracting.add(task)
            task.add_done_callback(self._extracting.discard)
        total = sum(c.tokens for c in chapters) + self._counter.count(text)
        if total > self._config.max_tokens * MERGE_FACTOR:
            await self._merge(conversation)
        return True

    async def merge(self, conversation: Conversation) -> bool:
        """Merge every chapter into one longer-term summary (session end, idle, or too long);
        one gateway at a time, as ``refresh``."""
        async with self._store.claim(SUMMARY_CLAIM, conversation.id) as mine:
            return mine and await self._merge(conversation)

    async def _extract_fold(self, conversation_id: int, pending: list[StoredMessage]) -> None:
        """Facts from a folded chapter's messages (the chapter stands whatever happens here;
        what is missed is read again at the session's close)."""
        assert self._extractor is not None
        try:
            async with self._store.claim(FACTS_CLAIM, conversation_id) as mine:
                if mine:  # (a session close holding it reads these messages too)
                    await self._extractor.extract(conversation_id, pending)
        except (LLMUnavailable, BackgroundPreempted) as exc:
            log.info("facts at the fold of conversation %d postponed: %s", conversation_id, exc)
        except Exception:  # loop boundary: facts must never take the bot down
            log.exception("facts at the fold of conversation %d failed", conversation_id)

    async def _merge(self, conversation: Conversation) -> bool:
        chapters = await self._store.summaries(conversation)
        if len(chapters) < 2:
            return False
        words = max(20, int(self._config.max_tokens * 0.6))
        text = await self._write(MERGE_PROMPT, _merge_input(chapters), words)
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

    async def _write(self, instruction: str, material: str, words: int) -> str:
        """Ask for a summary of ``words`` words; once more at half if the answer was cut or
        too long; a second cut answer is kept to its last full sentence and marked."""
        limit = self._config.max_tokens
        for attempt in range(2):
            prompt = [
                ChatMessage("system", instruction.format(words=words)),
                ChatMessage("user", material),
            ]
            completion = await self._llm.complete(prompt, max_tokens=limit)
            text = completion.text.strip()
            if not completion.truncated and self._counter.count(text) <= limit:
                return text
            log.info("summary cut or too long (attempt %d); asking for a shorter one", attempt + 1)
            words = max(10, words // 2)
        text = _last_sentence(text.removesuffix(TRUNCATED_MARK).rstrip())
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


def _bounded(pending: list[StoredMessage], counter: TokenCounter) -> list[StoredMessage]:
    """A front part of ``pending`` within the input bounds that ends on a turn boundary."""
    used, n = 0, 0
    for msg in pending[:MAX_FOLD_MESSAGES]:
        if n and used + msg.tokens > FOLD_INPUT_TOKENS:
            break
        used += msg.tokens
        n += 1
    while 1 < n < len(pending) and pending[n].role != USER:
        n -= 1  # the next window must start with the person speaking
    return pending[:n]


def _last_sentence(text: str) -> str:
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    return text[: ends[-1]] if ends else text


def _fold_input(before: str, messages: Sequence[StoredMessage]) -> str:
    lines = [f"Earlier chapter (context only): {before or '(none yet)'}", "", "New messages:"]
    lines += [f"{m.author}: {m.text}" for m in messages]
    return "\n".join(lines)


def _merge_input(chapters: Sequence[Summary]) -> str:
    return "\n\n".join(f"Chapter {i}: {c.text}" for i, c in enumerate(chapters, 1))
