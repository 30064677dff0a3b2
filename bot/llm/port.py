"""The LLM port: one method. Retries, timeouts, fallbacks and error mapping live in adapters.

Invariant: ``complete`` either returns non-empty text or raises ``LLMUnavailable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    model: str  # the model that answered (a fallback may have)
    truncated: bool = False  # the server stopped at max_tokens


class LLM(Protocol):
    @property
    def model_name(self) -> str: ...

    async def complete(self, messages: Sequence[ChatMessage], *, max_tokens: int) -> Completion: ...
