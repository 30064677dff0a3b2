"""The summarizer as it was before the cache-stable layout (commit 5afab4e), kept verbatim
so ``bench.prefix`` and ``bench.real_llm`` can measure the old layout next to the new one in
the same run. Not used by the bot.

Rolling summary: old turns that left the recent window are folded into the summary.

Invariants:
- Incremental: new summary = LLM(old summary + newly evicted turns); the saved row covers
  ``first_message_id``..``last_message_id`` (the old summary's first id, or the first folded
  message), so what a summary dropped can always be checked against the log.
- Runs in owned background tasks (one per conversation at most) through the LLM gate's
  background lane: it never delays a reply. A failure keeps the last good summary and the
  conversation is retried after ``retry_seconds``.
- A summary begun before a ``!reset`` is refused by the store at save time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from bot.config import SummaryConfig
from bot.errors import LLMUnavailable
from bot.llm.gate import BackgroundPreempted
from bot.llm.port import LLM, ChatMessage
from bot.llm.tokens import TokenCounter
from bot.memory.port_derived import Derived
from bot.memory.port_log import ConversationLog
from bot.memory.store import Conversation, StoredMessage

log = logging.getLogger("bot.memory.summary")

PROMPT = (
    "You maintain a short running summary of a chat between a person and an assistant. "
    "Merge the existing summary with the new messages into one summary of at most {words} "
    "words. Keep names, dates, decisions, preferences and open questions; drop small talk. "
    "Write plain sentences, no preamble."
)


class LegacySummaryStore(ConversationLog, Derived, Protocol):
    """What the legacy summarizer reads and writes."""


MAX_FOLD_MESSAGES = 60


class Summarizer:
    def __init__(
        self,
        *,
        store: LegacySummaryStore,
        llm: LLM,
        counter: TokenCounter,
        config: SummaryConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._llm = llm
        self._counter = counter
        self._config = config
        self._clock = clock
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._retry_at: dict[int, float] = {}
        self._closed = False

    def maybe_schedule(
        self,
        conversation: Conversation,
        *,
        window_start_id: int | None,
        base: object = None,  # today's responder passes its prompt (continuations): unused
    ) -> bool:
        """Start a background refresh if enough turns left the window; never blocks."""
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
            pass  # a reply needed the LLM; the next turn schedules this again
        except LLMUnavailable as exc:
            self._retry_at[conversation.id] = self._clock() + self._config.retry_seconds
            log.info("summary for conversation %d postponed: %s", conversation.id, exc)
        except Exception:  # loop boundary: a summary must never take the bot down
            self._retry_at[conversation.id] = self._clock() + self._config.retry_seconds
            log.exception("summary for conversation %d failed", conversation.id)

    async def refresh(self, conversation: Conversation, *, window_start_id: int) -> bool:
        """Fold unsummarized messages older than the window into the summary, if enough."""
        old = await self._store.latest_summary(conversation)
        after = max(conversation.reset_after, old.last_message_id if old else 0)
        pending = await self._store.messages_between(
            conversation.id, after_id=after, up_to_id=window_start_id - 1
        )
        if len(pending) < self._config.min_evicted:
            return False
        pending = pending[:MAX_FOLD_MESSAGES]
        words = max(20, int(self._config.max_tokens * 0.6))
        prompt = [
            ChatMessage("system", PROMPT.format(words=words)),
            ChatMessage("user", _fold_input(old.text if old else "", pending)),
        ]
        completion = await self._llm.complete(prompt, max_tokens=self._config.max_tokens)
        text = completion.text.strip()
        saved = await self._store.save_summary(
            conversation.id,
            text=text,
            first_message_id=old.first_message_id if old else pending[0].id,
            last_message_id=pending[-1].id,
            tokens=self._counter.count(text),
        )
        self._retry_at.pop(conversation.id, None)
        if saved:
            log.debug(
                "summary for conversation %d now covers up to %d", conversation.id, pending[-1].id
            )
        return saved

    async def stop(self, *, timeout: float = 5.0) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(tasks, timeout=timeout)

    @property
    def running(self) -> int:
        return len(self._tasks)

    # What today's responder calls besides (not in the old code): the old summarizer has no
    # fold debts, so nothing waits and no slot is kept.
    async def settle(self, conversation_id: int) -> float:
        return 0.0

    def before_reply(self, conversation_id: int, window_start_id: int | None) -> None:
        return None

    def forget(self, transport: str, person: str, *, space: str | None = None) -> int:
        return 0


def _fold_input(old_summary: str, messages: list[StoredMessage]) -> str:
    lines = [f"Existing summary: {old_summary or '(none yet)'}", "", "New messages:"]
    lines += [f"{m.author}: {m.text}" for m in messages]
    return "\n".join(lines)
