"""A server on a virtual clock: an LLM port that evaluates a prompt at ``rate`` tokens a second
(``CHARS_PER_TOKEN`` characters a token, as the gate estimates) before its first text, reusing
the prefix it saw last (a one-slot server's cache), and logs what it was sent.

Invariants: the clock is a one-item list the test owns (the gate reads the same list); only the
uncached tail of a prompt costs time; ``calls`` holds (kind, tokens, sent at) per request, the
kind being "probe" for the gate's measuring requests, else the prompt's text before its first
colon.
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.llm.gate import CHARS_PER_TOKEN
from bot.llm.port import ChatMessage, Completion, JsonSchema, OnText
from tests.fakes.fake_llm import is_probe


class SlowServer:
    model_name = "slow"

    def __init__(self, clock: list[float], *, rate: float, latency: float = 0.2) -> None:
        self._clock = clock
        self._rate = rate
        self._latency = latency
        self._seen = ""
        self.calls: list[tuple[str, int, float]] = []

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
        model: str | None = None,
    ) -> Completion:
        text = "".join(m.content for m in messages)
        new = text[len(self._seen) :] if text.startswith(self._seen) else text
        self._seen = text
        tokens = len(new) / CHARS_PER_TOKEN
        kind = "probe" if is_probe({"messages": [{"content": text}]}) else text.split(":", 1)[0]
        self.calls.append((kind, int(tokens), self._clock[0]))
        self._clock[0] += self._latency + tokens / self._rate
        if on_text is not None:
            await on_text("ok")
        self._clock[0] += 0.1
        return Completion(text="ok", model=self.model_name)
