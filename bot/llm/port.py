"""The LLM port: one method. Retries, timeouts, fallbacks and error mapping live in adapters.

Invariant: ``complete`` either returns non-empty text or raises ``LLMUnavailable``. With
``on_text`` the answer is streamed: ``on_text`` gets the visible text so far (reasoning
stripped) as it grows; a retry or a fallback starts again from "" (so the text may shrink);
the returned ``Completion`` is what counts. Adapters that cannot stream ignore ``on_text``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Role = Literal["system", "user", "assistant"]
OnText = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str
    images: tuple[str, ...] = ()  # data: URLs, sent as OpenAI image parts (llm.vision)


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    model: str  # the model that answered (a fallback may have)
    truncated: bool = False  # the server stopped at max_tokens


class LLM(Protocol):
    @property
    def model_name(self) -> str: ...

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, on_text: OnText | None = None
    ) -> Completion: ...
