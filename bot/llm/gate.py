"""Bounded LLM access with priority: replies first, background work (summaries) only when idle.

Invariants:
- At most ``limit`` calls run at once (a Pi serves one generation at a time).
- A background call starts only when a slot is free and no reply is waiting; when a reply needs
  a slot that a background call holds, the background call is cancelled (its HTTP request is
  dropped, which also stops generation on Ollama/llama.cpp) and retried later by its owner.
  So a summary never delays a reply by more than the time to cancel a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bot.errors import LLMUnavailable
from bot.llm.port import LLM, ChatMessage, Completion, OnText


class BackgroundPreempted(LLMUnavailable):
    """A background call gave its slot to a reply; try again later."""

    def __init__(self) -> None:
        super().__init__("background LLM call preempted by a reply; it will be retried")


class LLMGate:
    def __init__(self, *, llm: LLM, limit: int) -> None:
        self._llm = llm
        self._limit = limit
        self._running = 0
        self._fg_waiting = 0
        self._background: set[asyncio.Task[Completion]] = set()
        self._changed = asyncio.Condition()

    @property
    def model_name(self) -> str:
        return self._llm.model_name

    @property
    def foreground(self) -> LLM:
        return _Bound(self, background=False)

    @property
    def background(self) -> LLM:
        return _Bound(self, background=True)

    async def _run(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        background: bool,
        on_text: OnText | None = None,
    ) -> Completion:
        async with self._changed:
            if not background:
                self._fg_waiting += 1
                try:
                    while self._running >= self._limit:
                        for task in list(self._background):
                            task.cancel()  # give the slot to the person waiting
                        await self._changed.wait()
                finally:
                    self._fg_waiting -= 1
            else:
                while self._running >= self._limit or self._fg_waiting:
                    await self._changed.wait()
            self._running += 1
        try:
            if not background:
                return await self._llm.complete(messages, max_tokens=max_tokens, on_text=on_text)
            task = asyncio.ensure_future(self._llm.complete(messages, max_tokens=max_tokens))
            self._background.add(task)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled() and not _current_cancelling():
                    raise BackgroundPreempted() from None
                task.cancel()
                raise
            finally:
                self._background.discard(task)
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()


def _current_cancelling() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


class _Bound:
    def __init__(self, gate: LLMGate, *, background: bool) -> None:
        self._gate = gate
        self._background = background

    @property
    def model_name(self) -> str:
        return self._gate.model_name

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, on_text: OnText | None = None
    ) -> Completion:
        return await self._gate._run(
            messages, max_tokens=max_tokens, background=self._background, on_text=on_text
        )
