"""Bounded LLM access with priority: replies first, background work (summaries) only when idle.

Invariants:
- At most ``limit`` calls run at once (a Pi serves one generation at a time).
- A background call starts only when a slot is free, no reply is waiting for the LLM and
  ``busy()`` is false (the app passes "a turn is in progress", so a summary does not start
  between a message's arrival and its reply's LLM call).
- A running background call is cancelled as soon as a reply needs the LLM or ``busy()``
  turns true (checked every ``BUSY_POLL`` seconds). The adapter streams, so cancelling closes
  the connection, which stops generation on llama.cpp, Ollama and vLLM; the owner retries
  later (``BackgroundPreempted``). A summary therefore never delays a reply by more than the
  time to close a request.
- An outage is shared, not queued: when a reply's call fails as unavailable (every endpoint
  and fallback tried), the replies waiting behind it fail at that moment instead of each
  waiting out its own timeout, and until a call succeeds again one probe runs at a time while
  other replies fail at once. So a person's "LLM unavailable" notice never waits behind another
  person's hung call once the outage is known. ``ContextTooLong`` is about one prompt, not the
  server, and does not count.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from bot.errors import LLMUnavailable
from bot.llm.port import LLM, ChatMessage, Completion, ContextTooLong, JsonSchema, OnText

BUSY_POLL = 0.05


class BackgroundPreempted(LLMUnavailable):
    """A background call gave its slot to a reply; try again later."""

    def __init__(self) -> None:
        super().__init__("background LLM call preempted by a reply; it will be retried")


class LLMGate:
    def __init__(self, *, llm: LLM, limit: int, busy: Callable[[], bool] = lambda: False) -> None:
        self._llm = llm
        self._limit = limit
        self._busy = busy
        self._running = 0
        self._fg_waiting = 0
        self._background: set[asyncio.Task[Completion]] = set()
        self._changed = asyncio.Condition()
        self.preempted = 0  # background calls cancelled for a reply (for logs and benchmarks)
        self._outages = 0  # foreground failures as unavailable, ever (waiters compare it)
        self._fg_running = 0
        self._down = False  # the last foreground call failed as unavailable; none succeeded since

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
        schema: JsonSchema | None = None,
    ) -> Completion:
        async with self._changed:
            if not background:
                seen = self._outages
                if self._down and self._fg_running:
                    raise LLMUnavailable("the LLM server is down; a probe request is running")
                self._fg_waiting += 1
                try:
                    for task in list(self._background):
                        task.cancel()  # the person waiting comes first (and frees the server)
                    while self._running >= self._limit:
                        await self._changed.wait()
                        if self._outages != seen:
                            raise LLMUnavailable("the LLM server failed the request ahead")
                finally:
                    self._fg_waiting -= 1
            else:
                while self._running >= self._limit or self._fg_waiting or self._busy():
                    # busy() has no event: poll it. asyncio.timeout, not wait_for: wait_for
                    # waits in another task, and a cancel arriving while that task took the
                    # lock back left it holding the lock for good (every later call hung).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(BUSY_POLL if self._busy() else None):
                            await self._changed.wait()
            self._running += 1
        try:
            if not background:
                return await self._foreground_call(
                    messages, max_tokens=max_tokens, on_text=on_text, schema=schema
                )
            return await self._background_call(messages, max_tokens=max_tokens, schema=schema)
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()

    async def _foreground_call(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
    ) -> Completion:
        self._fg_running += 1
        try:
            completion = await self._llm.complete(
                messages, max_tokens=max_tokens, on_text=on_text, schema=schema
            )
        except ContextTooLong:
            raise  # this prompt's problem, not the server's
        except LLMUnavailable:
            async with self._changed:
                self._outages += 1
                self._down = True
                self._changed.notify_all()
            raise
        finally:
            self._fg_running -= 1
        self._down = False
        return completion

    async def _background_call(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, schema: JsonSchema | None = None
    ) -> Completion:
        task = asyncio.ensure_future(
            self._llm.complete(messages, max_tokens=max_tokens, schema=schema)
        )
        self._background.add(task)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=BUSY_POLL)
                if not task.done() and self._busy():
                    task.cancel()
                    break
            try:
                return await task
            except asyncio.CancelledError:
                if _current_cancelling():
                    raise  # our owner is cancelling us (shutdown)
                self.preempted += 1
                raise BackgroundPreempted() from None
        except asyncio.CancelledError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # let the adapter close its stream before we go
            raise
        finally:
            self._background.discard(task)


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
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
    ) -> Completion:
        return await self._gate._run(
            messages,
            max_tokens=max_tokens,
            background=self._background,
            on_text=on_text,
            schema=schema,
        )
