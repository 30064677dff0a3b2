"""Regression (found by bench.pipeline hanging on main, 2026-11-26): a background LLM call
waiting for its turn polls the gate's condition with a timeout. With ``asyncio.wait_for`` the
wait ran in a separate task; when the poll timed out while another task held the lock, and the
caller was cancelled meanwhile (a summary preempted or stopped), the caller left its
``async with`` before the wait had the lock back: its exit released someone else's hold, and
the wait task then took the lock for good. Every later LLM call hung. The caller must leave
only once it holds the lock again, so that its release is its own."""

from __future__ import annotations

import asyncio

import pytest

from bot.llm.gate import BUSY_POLL, LLMGate
from bot.llm.port import ChatMessage, Completion, OnText


class _Never:
    model_name = "never"

    async def complete(
        self,
        messages: object,
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: object = None,
        model: str | None = None,
    ) -> Completion:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def test_a_cancelled_background_poll_leaves_the_lock_as_it_found_it() -> None:
    gate = LLMGate(llm=_Never(), limit=1, busy=lambda: True)  # a reply is always typing
    waiter = asyncio.ensure_future(
        gate.background.complete([ChatMessage("user", "summarize")], max_tokens=5)
    )
    await asyncio.sleep(BUSY_POLL / 2)  # the waiter polls the condition (lock released)
    await gate._changed.acquire()  # another task holds the lock when the poll times out
    await asyncio.sleep(BUSY_POLL * 3)
    waiter.cancel()  # the summary is stopped while its poll waits to get the lock back
    await asyncio.sleep(BUSY_POLL)
    assert not waiter.done()  # it leaves only with the lock back in hand
    gate._changed.release()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not gate._changed.locked()  # nobody holds it: the next call can run
