"""The LLM port: one method. Retries, timeouts, fallbacks and error mapping live in adapters.

Invariants:
- ``complete`` either returns non-empty text or raises ``LLMUnavailable``.
- A completion the server cut at ``max_tokens`` has ``truncated`` set and its text ends with
  ``TRUNCATED_MARK``, so the person sees that the answer stops early.
- A completion whose stream the server broke off (no end was ever sent, on every attempt)
  has ``cut`` (and ``truncated``) set and its text ends with ``CUT_MARK``: it is never a
  whole answer.
- ``ContextTooLong`` means the server refused the prompt as longer than its context (in any
  form: a 400, an empty or erroring stream, a prompt it truncated); the caller rebuilds the
  prompt smaller and asks again. It is never an outage.
- With ``on_text`` the answer is streamed: ``on_text`` gets the visible text so far
  (reasoning stripped) as it grows; a retry or a fallback starts again from "" (so the text
  may shrink); the returned ``Completion`` is what counts. Adapters that cannot stream
  ignore ``on_text``.
- With ``model`` (the model chosen for the conversation being answered, ``bot.chat_settings``)
  the primary endpoint is asked for that model instead of ``llm.model``; fallbacks keep theirs.
  None: the configured model.
- With ``schema`` (a JSON schema of the answer) the adapter asks the server for structured
  output where it has one (OpenAI ``json_schema``, llama.cpp ``json_object`` with a schema,
  bot.llm.structured) and sends a plain request where it has none, so the caller must still
  parse and check the text: a schema is a request, never a guarantee.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from bot.errors import LLMUnavailable

TRUNCATED_MARK = " […]"
CUT_MARK = " […] (the answer broke off)"

Role = Literal["system", "user", "assistant"]
OnText = Callable[[str], Awaitable[None]]
JsonSchema = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str
    images: tuple[str, ...] = ()  # data: URLs, sent as OpenAI image parts (llm.vision)


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    model: str  # the model that answered (a fallback may have)
    truncated: bool = False  # the server stopped at max_tokens (or the stream broke off)
    cut: bool = False  # the stream broke off before the server ended it


class LLM(Protocol):
    @property
    def model_name(self) -> str: ...

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
        model: str | None = None,
    ) -> Completion: ...


class ContextTooLong(LLMUnavailable):
    """The prompt is longer than the server's context (HTTP 400 context_length_exceeded, an
    empty or erroring stream, a truncated prompt)."""

    def __init__(self, server_message: str) -> None:
        super().__init__(
            f"the LLM server refused the prompt as too long ({server_message}). Fix: nothing "
            "for the person (the prompt is rebuilt smaller); to keep more history raise the "
            "server's context (llama.cpp --n_ctx / -c, Ollama num_ctx) or lower context_tokens."
        )
        self.server_message = server_message


def merge_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """For chat templates without a system role (Gemma): the system text opens the first user
    message. The result is as stable between turns as the input (the first user message only
    changes at a fold)."""
    if not messages or messages[0].role != "system":
        return list(messages)
    system, rest = messages[0].content, list(messages[1:])
    if rest and rest[0].role == "user":
        return [replace(rest[0], content=f"{system}\n\n{rest[0].content}"), *rest[1:]]
    return [ChatMessage("user", system), *rest]
