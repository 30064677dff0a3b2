"""Bounded LLM access with priority: replies first, background work only where it fits.

A one-slot server (llama.cpp, Ollama on a Pi) serves one request at a time and cannot stop
evaluating a prompt it has started: closing a request stops only its generation. So a
background prompt abandoned for a reply still holds the slot until it is evaluated, and the
reply waits behind it. The gate therefore decides *when* background work starts, not only
when it stops.

Lanes:
- ``foreground``: a reply. Waits only for the calls already holding the slots.
- ``debt``: work that must happen now (a fold that found no room in the background within
  its turns, ``bot.memory.summary``): queued like a reply, never preempted, sized by its
  caller to what fits (``fit_tokens``), and its wait is counted as background for replies.
- ``background``: summaries, facts, sessions. Starts only when a slot is free, no reply is
  waiting, ``busy()`` is false (a turn in progress) and the call is *expected to end before
  the next reply needs the slot* (``fits``): its cost (uncached prompt tokens over the learned
  prompt rate, ``max_tokens`` over the learned generation rate) within the free time learned
  from the recent gaps between one reply's end and the next request.

Invariants:
- At most ``limit`` calls run at once (a Pi serves one generation at a time).
- A running background call is cancelled as soon as a reply needs the LLM or ``busy()``
  turns true (checked every ``BUSY_POLL`` seconds). The adapter streams, so cancelling closes
  the connection, which stops generation; the owner gets ``BackgroundPreempted`` and does not
  retry at once: the next attempt waits for a gap it fits in (the short gap that preempted it
  is among those learned).
- Rates and gaps are learned from this gate's own calls (streamed: the first text marks the end
  of prompt evaluation); a call too quick to time still bounds the rate from below
  (``rate_floor``). Nothing here reads a wall clock except through ``clock``.
- No unmeasured background prompt: while neither a rate nor a floor is known (a fresh start,
  a new server), a background call of more than ``UNMEASURED_TOKENS`` uncached tokens does
  not start; the gate first measures the server with small requests (``PROBE_CHARS``, one
  token answered, each step eight times the last and sent only while the last was too quick
  to time), so no request holds the slot for more than a few seconds.
- No rhythm, no long prompt: until a reply has ended since the start (a pending session
  close, a fold recovered at start), a background call fits only when its prompt is expected
  to be evaluated within ``START_FREE`` seconds (generation can be stopped; evaluation
  cannot), so the first message waits at most that behind it.
- Commands are a person at work (``activity``: a count that changes with each command): the
  quiet that lets long work start is counted from the last command too, and the time between
  commands is a gap like the time between replies, so commands typed in a row never open a
  gap that a long prompt takes ahead of the next message.
- An outage is shared, not queued: when a reply's call fails as unavailable (every endpoint
  and fallback tried), the replies waiting behind it fail at that moment instead of each
  waiting out its own timeout, and until a call succeeds again one probe runs at a time while
  other replies fail at once. ``ContextTooLong`` is about one prompt, not the server, and does
  not count.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bot.errors import LLMUnavailable
from bot.llm.port import LLM, ChatMessage, Completion, ContextTooLong, JsonSchema, OnText
from bot.llm.prompt_cost import common_prefix, ewma, line, render

BUSY_POLL = 0.05
CHARS_PER_TOKEN = 4.0  # estimate for cache accounting (the gate has no tokenizer)
GAPS_KEPT = 8  # recent gaps between a reply's end and the next request
EVALS_KEPT = 16  # recent (prompt tokens, seconds to first text) pairs
MIN_MEASURED_SECONDS = 0.05
# Quiet past IDLE_FACTOR times the longest gap and IDLE_AFTER seconds: nobody is writing.
IDLE_FACTOR = 2.0
IDLE_AFTER = 5.0
UNMEASURED_TOKENS = 64  # a background prompt sent before any rate is known: a few seconds at 16/s
START_FREE = 2.0  # seconds of evaluation a background prompt may take before any reply ended
PROBE_CHARS = (128, 1024, 8192)  # measuring steps (about 32, 256 and 2,048 tokens)
PROBE_MARK = "(meshsage measures the server's prompt speed) Say OK. "
PROBE_WORDS = "The quick brown fox jumps over the lazy dog near the river bank. "
PROBE_ANSWER_TOKENS = 4
PROBE_RETRY = 30.0  # seconds before a measurement that failed (the server down) is tried again

log = logging.getLogger(__name__)
HOLD_SECONDS = 2.0  # real seconds a slot kept for a debt waits for it before it is let go

Lane = Literal["foreground", "debt", "background"]
_HOLD_FOR_DEBT: contextvars.ContextVar[bool] = contextvars.ContextVar("hold", default=False)


def hold_for_debt() -> None:
    """The current task's next reply call keeps its slot, once it ends, for the debt call
    that follows it (``bot.memory.summary``): on a one-slot server the debt then continues
    the prompt still in the cache instead of queueing behind other people's replies."""
    _HOLD_FOR_DEBT.set(True)


class BackgroundPreempted(LLMUnavailable):
    """A background call gave its slot to a reply; try again later."""

    def __init__(self) -> None:
        super().__init__("background LLM call preempted by a reply; it will be retried")


@dataclass(frozen=True, slots=True)
class _Ask:
    """What a call asks of the adapter beside the prompt (``LLM.complete``'s arguments)."""

    max_tokens: int
    schema: JsonSchema | None = None
    model: str | None = None  # the model chosen for the conversation (None: the configured)


@dataclass
class GateStats:
    """What the gate saw (status, logs, benchmarks, tests)."""

    background_calls: int = 0  # started (background and debt lanes)
    background_completed: int = 0
    debt_calls: int = 0
    preempted: int = 0
    holds_expired: int = 0  # slots kept for a debt that never called, let go after HOLD_SECONDS
    # Per reply: seconds it waited at the gate while background or debt work held the slot.
    reply_waits: list[float] = field(default_factory=list)


class LLMGate:
    def __init__(
        self,
        *,
        llm: LLM,
        limit: int,
        busy: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        activity: Callable[[], int] = lambda: 0,
    ) -> None:
        self._llm = llm
        self._activity = activity  # changes with each command a person sends
        self._activity_seen = 0
        self._active_at: float | None = None  # when the last command was seen
        self.rate_floor: float | None = None  # prompt tokens/s at least (calls too quick to time)
        self._probing = False
        self._probe_after = 0.0  # a failed measurement is not tried again before this
        self.probes = 0  # measuring requests sent
        self._limit = limit
        self._busy = busy
        self._clock = clock
        self._running = 0
        self._bg_running = 0  # background and debt calls holding a slot
        self._fg_waiting = 0
        self._background: set[asyncio.Task[Completion]] = set()
        self._changed = asyncio.Condition()
        self.stats = GateStats()
        self._outages = 0  # foreground failures as unavailable, ever (waiters compare it)
        self._fg_running = 0
        self._down = False  # the last foreground call failed as unavailable; none succeeded since
        # What the server's cache holds after the last call: its prompt and answer (rendered).
        self._cached = ""
        # (uncached prompt tokens, seconds to the first text) of recent calls: a line through
        # them gives a fixed latency (HTTP, sampling the first token) and a per-token cost.
        self._evals: deque[tuple[int, float]] = deque(maxlen=EVALS_KEPT)
        self.prompt_rate: float | None = None  # tokens per second evaluated (the line's slope)
        self.latency = 0.0  # seconds to the first text of an empty prompt (the line's start)
        self.gen_rate: float | None = None  # tokens per second generated
        self._gaps: deque[float] = deque(maxlen=GAPS_KEPT)
        self._fg_ended: float | None = None  # when the last reply's call ended
        self._held = False  # a slot kept for a debt call (``hold_for_debt``); still counted
        self._hold_id = 0

    @property
    def preempted(self) -> int:
        return self.stats.preempted

    @property
    def model_name(self) -> str:
        return self._llm.model_name

    @property
    def foreground(self) -> LLM:
        return _Bound(self, lane="foreground")

    @property
    def debt(self) -> LLM:
        return _Bound(self, lane="debt")

    @property
    def background(self) -> LLM:
        return _Bound(self, lane="background")

    # --- what fits ----------------------------------------------------------------------------
    def uncached_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Estimated prompt tokens the server evaluates for ``messages`` (after the common
        prefix with the last call's prompt and answer)."""
        text = render(messages)
        return math.ceil((len(text) - common_prefix(self._cached, text)) / CHARS_PER_TOKEN)

    def _look_at_activity(self) -> bool:
        """A command seen since the last look: the person is at work now (a gap closes, from
        the last person served to now). True when one was seen."""
        seen = self._activity()
        if seen == self._activity_seen:
            return False
        self._activity_seen = seen
        now = self._clock()
        last = self._last_person()
        if last is not None:
            self._gaps.append(max(0.0, now - last))
        self._active_at = now
        return True

    def _last_person(self) -> float | None:
        """When a person was last served: a reply's call ended, or a command was seen."""
        times = [t for t in (self._fg_ended, self._active_at) if t is not None]
        return max(times) if times else None

    def expected_free(self) -> float:
        """Seconds the slot is expected to stay free from now: the shortest recent gap between
        a person served (a reply's end, a command) and their next request, less the time
        since; ``inf`` when nothing is known or the quiet has long outlasted every gap seen
        (``IDLE_FACTOR``, ``IDLE_AFTER``)."""
        self._look_at_activity()
        last = self._last_person()
        if last is None or not self._gaps:
            return math.inf
        quiet = self._clock() - last
        if quiet > IDLE_FACTOR * max(self._gaps) + IDLE_AFTER:
            return math.inf
        return max(0.0, min(self._gaps) - quiet)

    def first_text_seconds(self, messages: Sequence[ChatMessage]) -> float | None:
        """Expected seconds from sending ``messages`` to the first text (None: not known)."""
        if self.prompt_rate is None:
            return None
        return self.latency + self.uncached_tokens(messages) / self.prompt_rate

    def _evaluation_bound(self, messages: Sequence[ChatMessage]) -> float | None:
        """Seconds the server is expected to spend on ``messages``' uncached part at most (the
        learned rate, or the floor); None while neither is known."""
        first = self.first_text_seconds(messages)
        if first is not None:
            return first
        if self.rate_floor is None:
            return None
        return self.uncached_tokens(messages) / self.rate_floor

    def _needs_measuring(self, messages: Sequence[ChatMessage]) -> bool:
        return (
            self.prompt_rate is None
            and self.rate_floor is None
            and self.uncached_tokens(messages) > UNMEASURED_TOKENS
        )

    def tokens_in(self, seconds: float | None) -> int | None:
        """Prompt tokens the server evaluates in ``seconds`` at the learned rate (None: the
        rate is not known yet, or no limit)."""
        if seconds is None or self.prompt_rate is None:
            return None
        return int(seconds * self.prompt_rate)

    def describe_speed(self, recall_seconds: float | None) -> str:
        """The learned prompt speed and the recall room it gives, for the status ("" while
        not known)."""
        if self.prompt_rate is None:
            return ""
        room = self.tokens_in(recall_seconds)
        held = f" (a reply's recall is held to {room} tokens)" if room is not None else ""
        return f"reads {self.prompt_rate:.0f} prompt tokens/s{held}"

    def fit_tokens(self, messages: Sequence[ChatMessage], *, seconds: float) -> int | None:
        """Completion tokens that fit in ``seconds`` after evaluating ``messages``' uncached
        part; None while the rates are not known yet (or no limit: ``seconds`` is inf)."""
        first = self.first_text_seconds(messages)
        if first is None or self.gen_rate is None or math.isinf(seconds):
            return None
        return max(0, int((seconds - first) * self.gen_rate))

    def fits(self, messages: Sequence[ChatMessage], *, max_tokens: int) -> bool:
        """Whether a background call is expected to end before a person needs the slot (see
        the module docstring: measured first, held to ``START_FREE`` before any reply)."""
        self._look_at_activity()
        evaluation = self._evaluation_bound(messages)
        if evaluation is None:
            return self.uncached_tokens(messages) <= UNMEASURED_TOKENS
        if self._fg_ended is None:
            return evaluation <= START_FREE
        free = self.expected_free()
        if math.isinf(free):
            return True
        # generation not measured yet: the evaluation alone must fit (it cannot be stopped)
        generation = max_tokens / self.gen_rate if self.gen_rate is not None else 0.0
        return evaluation + generation <= free

    # --- calls ----------------------------------------------------------------------------------
    async def _run(
        self, messages: Sequence[ChatMessage], ask: _Ask, *, lane: Lane, on_text: OnText | None
    ) -> Completion:
        max_tokens = ask.max_tokens
        hold = False
        if lane == "foreground":
            hold = _HOLD_FOR_DEBT.get()
            _HOLD_FOR_DEBT.set(False)
        async with self._changed:
            if lane == "debt" and self._held:
                self._held = False  # the slot its reply kept: already counted in _running
                self._bg_running += 1
                self.stats.background_calls += 1
                self.stats.debt_calls += 1
                return await self._run_held(messages, ask)
            if lane != "background":
                arrived = self._clock()
                # a command first seen now: its gap (up to now) is this request's too
                looked = lane == "foreground" and self._look_at_activity()
                last = self._last_person()
                if lane == "foreground" and (self._fg_running or self._fg_waiting):
                    self._gaps.append(0.0)  # replies queue: the slot is never free between
                elif lane == "foreground" and last is not None and not looked:
                    self._gaps.append(max(0.0, arrived - last))
                seen = self._outages
                if lane == "foreground" and self._down and self._fg_running:
                    raise LLMUnavailable("the LLM server is down; a probe request is running")
                self._fg_waiting += 1
                behind_background = 0.0
                try:
                    for task in list(self._background):
                        task.cancel()  # the person waiting comes first (and frees the server)
                    while self._running >= self._limit:
                        mark = self._clock()
                        held = self._bg_running > 0 or self._held
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(BUSY_POLL if self._held else None):
                                await self._changed.wait()
                        if held:
                            behind_background += self._clock() - mark
                        if lane == "foreground" and self._outages != seen:
                            raise LLMUnavailable("the LLM server failed the request ahead")
                finally:
                    self._fg_waiting -= 1
                if lane == "foreground":
                    self.stats.reply_waits.append(behind_background)
            else:
                while (
                    self._running >= self._limit
                    or self._fg_waiting
                    or self._busy()
                    or not self.fits(messages, max_tokens=max_tokens)
                ):
                    if (
                        self._needs_measuring(messages)
                        and not self._probing
                        and self._clock() >= self._probe_after
                        and self._running < self._limit
                        and not self._fg_waiting
                        and not self._busy()
                    ):
                        await self._measure()
                        continue
                    # busy() and the clock have no event: poll them. asyncio.timeout, not
                    # wait_for: wait_for waits in another task, and a cancel arriving while
                    # that task took the lock back left it holding the lock for good.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(BUSY_POLL):
                            await self._changed.wait()
            self._running += 1
            if lane != "foreground":
                self._bg_running += 1
                self.stats.background_calls += 1
                self.stats.debt_calls += lane == "debt"
        kept = False
        try:
            if lane == "foreground":
                completion = await self._foreground_call(messages, ask, on_text=on_text)
                kept = hold
                return completion
            if lane == "debt":
                completion = await self._timed(messages, ask, on_text=None)
            else:
                completion = await self._background_call(messages, ask)
            self.stats.background_completed += 1
            return completion
        finally:
            async with self._changed:
                if kept:
                    self._keep_for_debt()
                else:
                    self._running -= 1
                if lane != "foreground":
                    self._bg_running -= 1
                self._changed.notify_all()

    async def _measure(self) -> None:
        """Measure the server's prompt speed with small requests (the condition's lock is held
        on entry and on return; the slot is taken as by a background call, so a reply
        preempts it). Steps grow while each is too quick to time (``PROBE_CHARS``)."""
        self._probing = True
        self._running += 1
        self._bg_running += 1
        self._changed.release()
        try:
            for step, size in enumerate(PROBE_CHARS):
                filler = (PROBE_WORDS * (size // len(PROBE_WORDS) + 1))[:size]
                text = f"{PROBE_MARK}{step} {filler}"
                self.probes += 1
                try:
                    await self._background_call(
                        [ChatMessage("user", text)], _Ask(PROBE_ANSWER_TOKENS)
                    )
                except BackgroundPreempted:
                    break  # a reply came: it measures the server itself
                except LLMUnavailable as exc:  # the server is down: not again for a while
                    self._probe_after = self._clock() + PROBE_RETRY
                    log.info("the LLM server's prompt speed could not be measured (%s); "
                             "background work waits", exc)  # fmt: skip
                    break
                if self.prompt_rate is not None or self._busy() or self._fg_waiting:
                    break
        finally:
            await self._changed.acquire()
            self._probing = False
            self._running -= 1
            self._bg_running -= 1
            self._changed.notify_all()

    async def _run_held(self, messages: Sequence[ChatMessage], ask: _Ask) -> Completion:
        """A debt call in the slot its reply kept (the condition's lock is held on entry)."""
        self._changed.release()
        try:
            completion = await self._timed(messages, ask, on_text=None)
            self.stats.background_completed += 1
            return completion
        finally:
            await self._changed.acquire()
            self._running -= 1
            self._bg_running -= 1
            self._changed.notify_all()

    def drop_hold(self) -> None:
        """The debt a reply kept its slot for will not call (``bot.memory.summary``); the
        waiters poll while a slot is kept, so they see it within ``BUSY_POLL``."""
        if self._held:
            self._held = False
            self._running -= 1

    def _keep_for_debt(self) -> None:
        """Keep the slot (still counted) for the debt call; let it go after HOLD_SECONDS if
        none came (waiters poll while a slot is kept: a timer cannot take the lock). One slot
        is kept at most: a second reply keeping one (two slots) lets the earlier keep go."""
        if self._held:
            self._running -= 1
        self._held = True
        self._hold_id += 1
        hold_id = self._hold_id

        def let_go() -> None:
            if self._held and self._hold_id == hold_id:
                log.debug("a slot kept for a debt fold was let go: none came in %.0f s",
                          HOLD_SECONDS)  # fmt: skip
                self.stats.holds_expired += 1
                self._held = False
                self._running -= 1

        asyncio.get_running_loop().call_later(HOLD_SECONDS, let_go)

    async def _timed(
        self, messages: Sequence[ChatMessage], ask: _Ask, *, on_text: OnText | None
    ) -> Completion:
        """One call to the adapter, streamed, learning the prompt and generation rates."""
        new_tokens = self.uncached_tokens(messages)
        start = self._clock()
        first: list[float] = []

        async def seen(text: str) -> None:
            if text and not first:
                first.append(self._clock())
            if on_text is not None:
                await on_text(text)

        rendered = render(messages)
        try:
            completion = await self._llm.complete(
                messages,
                max_tokens=ask.max_tokens,
                on_text=seen,
                schema=ask.schema,
                model=ask.model,
            )
        except BaseException:
            # Whatever the server holds now, it starts with this prompt (or part of it).
            self._cached = rendered
            raise
        end = self._clock()
        self._cached = rendered + completion.text
        if first:
            self._learn(new_tokens, first[0] - start, len(completion.text), end - first[0])
        return completion

    def _learn(self, prompt_tokens: int, prompt_s: float, answer_chars: int, gen_s: float) -> None:
        if prompt_s < MIN_MEASURED_SECONDS and prompt_tokens > 0:  # too quick to time: a floor
            self.rate_floor = max(self.rate_floor or 0.0, prompt_tokens / MIN_MEASURED_SECONDS)
        if prompt_s >= MIN_MEASURED_SECONDS:
            self._evals.append((prompt_tokens, prompt_s))
            self.latency, per_token = line(self._evals)
            if per_token > 0:
                self.prompt_rate = 1 / per_token
        tokens = answer_chars / CHARS_PER_TOKEN
        if tokens >= 1 and gen_s >= MIN_MEASURED_SECONDS:
            self.gen_rate = ewma(self.gen_rate, tokens / gen_s)

    async def _foreground_call(
        self, messages: Sequence[ChatMessage], ask: _Ask, *, on_text: OnText | None
    ) -> Completion:
        self._fg_running += 1
        try:
            completion = await self._timed(messages, ask, on_text=on_text)
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
            self._fg_ended = self._clock()
        self._down = False
        return completion

    async def _background_call(self, messages: Sequence[ChatMessage], ask: _Ask) -> Completion:
        task = asyncio.ensure_future(self._timed(messages, ask, on_text=None))
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
                self.stats.preempted += 1
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
    def __init__(self, gate: LLMGate, *, lane: Lane) -> None:
        self._gate = gate
        self._lane: Lane = lane

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
        model: str | None = None,
    ) -> Completion:
        ask = _Ask(max_tokens, schema, model)
        return await self._gate._run(messages, ask, lane=self._lane, on_text=on_text)
