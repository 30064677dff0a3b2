"""The gate learns the server's prompt speed from its own calls (issue 27): what a reply's
recall may cost in seconds (``memory.retrieval.recall_seconds``) becomes tokens at that speed,
and nothing is limited before a speed is known."""

from __future__ import annotations

from bot.llm.gate import LLMGate
from bot.llm.port import ChatMessage
from tests.fakes.slow_server import SlowServer


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
