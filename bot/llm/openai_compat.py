"""OpenAI-compatible LLM adapter (Ollama, llama.cpp, vLLM, OpenAI) behind the one-method port.

Invariants:
- Every failure ends as ``LLMUnavailable``; no openai exception leaves this module.
- Each attempt has an explicit connect and read timeout and an overall deadline, so a server
  that trickles bytes cannot hold a turn forever. The openai client's own retries are off; ours
  are bounded (``retries`` per endpoint) with exponential backoff and jitter.
- Endpoints are tried in order: the primary, then each fallback. Errors that retrying cannot fix
  (model not found, bad key, bad request) move on to the next endpoint at once.
- Empty answers (after stripping ``<think>`` blocks) count as failures; over-long answers are
  cut to ``MAX_ANSWER_CHARS`` so a runaway server cannot flood memory or a transport.
- Secrets come from the environment variable named by ``api_key_env``; servers that need no
  key (Ollama) get a placeholder, because the openai client refuses to start without one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai

from bot.config import Endpoint, LLMConfig
from bot.errors import LLMUnavailable
from bot.llm.port import ChatMessage, Completion, OnText

log = logging.getLogger("bot.llm")

MAX_ANSWER_CHARS = 16_000
PLACEHOLDER_KEY = "not-needed"

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think>.*\Z", re.DOTALL | re.IGNORECASE)
_THINK_CLOSE = re.compile(r"\A.*?</think>", re.DOTALL | re.IGNORECASE)

_RETRYABLE: tuple[type[Exception], ...] = (
    openai.APIConnectionError,  # includes APITimeoutError
    openai.InternalServerError,
    openai.RateLimitError,
    openai.ConflictError,
    TimeoutError,
)


def strip_thinking(text: str) -> str:
    """Remove reasoning: closed blocks, a dangling close (open tag was in the prompt), an
    unclosed open tag (generation stopped while thinking)."""
    text = _THINK_BLOCK.sub("", text)
    if re.search("</think>", text, re.IGNORECASE):
        text = _THINK_CLOSE.sub("", text)
    text = _THINK_OPEN.sub("", text)
    return text.strip()


@dataclass(frozen=True, slots=True)
class _Target:
    endpoint: Endpoint
    client: openai.AsyncOpenAI


class OpenAICompatLLM:
    def __init__(
        self,
        *,
        config: LLMConfig,
        env: Mapping[str, str],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._config = config
        self._sleep = sleep
        timeout = openai.Timeout(
            config.read_timeout,
            connect=config.connect_timeout,
            write=config.connect_timeout,
            pool=config.connect_timeout,
        )
        self._targets = [
            _Target(
                endpoint=ep,
                client=openai.AsyncOpenAI(
                    base_url=ep.base_url,
                    api_key=(env.get(ep.api_key_env) if ep.api_key_env else None)
                    or PLACEHOLDER_KEY,
                    timeout=timeout,
                    max_retries=0,
                ),
            )
            for ep in (config, *config.fallbacks)
        ]

    @property
    def model_name(self) -> str:
        return self._config.model

    async def close(self) -> None:
        for target in self._targets:
            await target.client.close()

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, on_text: OnText | None = None
    ) -> Completion:
        payload = [_payload(m) for m in messages]
        problems: list[str] = []
        for target in self._targets:
            ep = target.endpoint
            for attempt in range(self._config.retries + 1):
                if attempt:
                    delay = self._config.retry_backoff * 2 ** (attempt - 1)
                    await self._sleep(delay * random.uniform(0.5, 1.0))
                try:
                    if on_text is not None:
                        return await self._attempt_streamed(target, payload, max_tokens, on_text)
                    return await self._attempt(target, payload, max_tokens)
                except _RETRYABLE as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {describe_error(exc)}")
                    log.warning("LLM attempt %d failed: %s", attempt + 1, problems[-1])
                except _EmptyAnswer:
                    problems.append(f"{ep.base_url} ({ep.model}): empty answer")
                    log.warning("LLM returned an empty answer from %s", ep.base_url)
                except openai.APIError as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {describe_error(exc)}")
                    log.warning("LLM endpoint unusable, trying the next: %s", problems[-1])
                    break
        raise LLMUnavailable(
            "no LLM endpoint answered: "
            + "; ".join(problems[-4:])
            + ". Fix: check that the server is running and the model is pulled "
            "(e.g. `ollama pull <model>`), or configure llm.fallbacks."
        )

    async def _attempt(
        self, target: _Target, payload: list[dict[str, Any]], max_tokens: int
    ) -> Completion:
        deadline = self._config.connect_timeout + self._config.read_timeout
        async with asyncio.timeout(deadline):
            resp = await target.client.chat.completions.create(
                model=target.endpoint.model,
                messages=payload,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=self._config.temperature,
            )
        choice = resp.choices[0] if resp.choices else None
        raw = (choice.message.content if choice is not None else None) or ""
        text = strip_thinking(raw) if self._config.strip_thinking else raw.strip()
        if not text:
            raise _EmptyAnswer
        truncated = bool(choice and choice.finish_reason == "length")
        if len(text) > MAX_ANSWER_CHARS:
            text, truncated = text[:MAX_ANSWER_CHARS], True
        return Completion(text=text, model=resp.model or target.endpoint.model, truncated=truncated)

    async def _attempt_streamed(
        self, target: _Target, payload: list[dict[str, Any]], max_tokens: int, on_text: OnText
    ) -> Completion:
        """One streamed request; ``on_text`` sees the visible answer as it grows."""
        deadline = self._config.connect_timeout + self._config.read_timeout
        raw, model, finish = "", target.endpoint.model, None
        await on_text("")  # a retry starts from nothing
        async with asyncio.timeout(deadline):
            stream = await target.client.chat.completions.create(
                model=target.endpoint.model,
                messages=payload,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=self._config.temperature,
                stream=True,
            )
            assert isinstance(stream, openai.AsyncStream)
            shown = ""
            async for chunk in stream:
                model = chunk.model or model
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                finish = choice.finish_reason or finish
                raw += choice.delta.content or ""
                visible = strip_thinking(raw) if self._config.strip_thinking else raw.strip()
                visible = visible[:MAX_ANSWER_CHARS]
                if visible != shown:
                    shown = visible
                    await on_text(visible)
        text = strip_thinking(raw) if self._config.strip_thinking else raw.strip()
        if not text:
            raise _EmptyAnswer
        truncated = finish == "length"
        if len(text) > MAX_ANSWER_CHARS:
            text, truncated = text[:MAX_ANSWER_CHARS], True
        return Completion(text=text, model=model, truncated=truncated)


def _payload(message: ChatMessage) -> dict[str, Any]:
    """One chat message; with images, OpenAI content parts (text first, then image_url)."""
    if not message.images:
        return {"role": message.role, "content": message.content}
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in message.images]
    return {"role": message.role, "content": parts}


class _EmptyAnswer(Exception):
    pass


def describe_error(exc: BaseException) -> str:
    """A short, text-free description of an openai client error (for logs and messages)."""
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIConnectionError):
        return "connection failed"
    return type(exc).__name__
