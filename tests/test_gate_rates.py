"""The gate learns the server's prompt speed from its own calls (issue 27): what a reply's
recall may cost in seconds (``memory.retrieval.recall_seconds``) becomes tokens at that speed,
and nothing is limited before a speed is known."""

from __future__ import annotations

from collections.abc import Sequence

from bot.llm.gate import CHARS_PER_TOKEN, LLMGate
from bot.llm.port import ChatMessage, Completion, JsonSchema, OnText


class SlowServer:
    """Evaluates a prompt at ``rate`` tokens a second (on the gate's clock) before its first
    text; the gate's cache estimate counts ``CHARS_PER_TOKEN`` characters a token."""

    model_name = "slow"

    def __init__(self, clock: list[float], *, rate: float, latency: float = 0.2) -> None:
        self._clock = clock
        self._rate = rate
        self._latency = latency
        self._seen = ""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
    ) -> Completion:
        text = "".join(m.content for m in messages)
        new = text[len(self._seen) :] if text.startswith(self._seen) else text
        self._seen = text
        self._clock[0] += self._latency + len(new) / CHARS_PER_TOKEN / self._rate
        if on_text is not None:
            await on_text("ok")
        self._clock[0] += 0.1
        return Completion(text="ok", model="slow")


async def test_recall_seconds_become_tokens_at_the_learned_prompt_speed() -> None:
    clock = [0.0]
    gate = LLMGate(llm=SlowServer(clock, rate=40.0), limit=1, clock=lambda: clock[0])
    assert gate.tokens_in(2.0) is None  # nothing measured yet: no limit
    history = ""
    for n in range(6):  # a conversation that grows by a different amount each turn
        history += f"turn {n}: " + "word " * (20 * (n + 1))
        await gate.foreground.complete([ChatMessage("user", history)], max_tokens=8)
    room = gate.tokens_in(2.0)
    assert room is not None and 70 <= room <= 90  # 2 s at 40 tokens a second (estimate)
    assert gate.tokens_in(None) is None  # recall_seconds: null, no limit
