"""OpenAI-compatible LLM adapter (Ollama, llama.cpp, vLLM, OpenAI) behind the one-method port.

Invariants:
- Every failure ends as ``LLMUnavailable``; no openai exception leaves this module.
- Requests are streamed (``stream: true``): leaving an attempt for any reason (read timeout,
  deadline, a reply preempting a summary) closes the connection, and closing a streamed
  response stops generation on llama.cpp/Ollama/vLLM, so a retry never queues behind its own
  abandoned first attempt. A server that answers a streamed request with plain JSON is read
  as JSON.
- Each attempt has an explicit connect timeout, a read timeout between bytes (the first byte
  comes after the whole prompt is evaluated: on a Pi that is most of the wait) and an overall
  deadline of ``connect_timeout + 2 * read_timeout``. The openai client's own retries are off;
  ours are bounded (``retries`` per endpoint) with exponential backoff and jitter.
- Endpoints are tried in order: the primary, then each fallback. Errors that retrying cannot fix
  (model not found, bad key, bad request) move on to the next endpoint at once. HTTP 400
  ``context_length_exceeded`` ends as ``ContextTooLong`` (with the server's own message) when
  no endpoint answered, so the caller can retry once with a smaller budget.
- Anything that is not a usable chat completion (non-JSON, an HTML error page, no choices or
  no message, empty text after removing ``<think>`` blocks) is a failure of that attempt:
  retried, then the fallbacks, then ``LLMUnavailable``.
- Model output is cleaned before anyone stores or sends it: ANSI escape sequences, control
  characters (NUL included; newlines and tabs kept) and bidi overrides/isolates are removed.
  Over-long answers are cut to ``MAX_ANSWER_CHARS``; an answer cut by ``max_tokens`` (or here)
  ends with ``TRUNCATED_MARK``.
- ``system_role: false`` on an endpoint merges the system message into the first user message
  (templates without a system role).
- Secrets come from the environment variable named by ``api_key_env``; servers that need no
  key (Ollama) get a placeholder, because the openai client refuses to start without one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import unicodedata
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai

from bot.config import Endpoint, LLMConfig
from bot.errors import LLMUnavailable
from bot.llm.port import (
    MODEL_CHOICE,
    TRUNCATED_MARK,
    ChatMessage,
    Completion,
    ContextTooLong,
    OnText,
    merge_system,
)

log = logging.getLogger("bot.llm")

MAX_ANSWER_CHARS = 16_000
PLACEHOLDER_KEY = "not-needed"

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_LEADING_OPEN = re.compile(r"\A\s*<think>(?!.*</think>).*\Z", re.DOTALL | re.IGNORECASE)
_THINK_CLOSE = re.compile(r"\A.*?</think>", re.DOTALL | re.IGNORECASE)
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_CONTEXT_ERROR = re.compile(
    r"context_length_exceeded|context (?:length|window|size)|maximum context|n_ctx|too many tokens"
    r"|exceeds? the (?:available )?context",
    re.IGNORECASE,
)

_RETRYABLE: tuple[type[Exception], ...] = (
    openai.APIConnectionError,  # includes APITimeoutError
    openai.InternalServerError,
    openai.RateLimitError,
    openai.ConflictError,
    TimeoutError,
)


def strip_thinking(text: str) -> str:
    """Remove reasoning, not talk about it: closed ``<think>…</think>`` blocks, everything up to
    a dangling close when no open tag precedes it (the open tag was in the prompt), and an
    output that opens with ``<think>`` and never closes it (generation stopped while thinking).
    A lone ``<think>`` later in an answer is the answer talking about the tag, and stays."""
    text = _THINK_BLOCK.sub("", text)
    low = text.lower()
    if "</think>" in low and "<think>" not in low[: low.index("</think>")]:
        text = _THINK_CLOSE.sub("", text)
    text = _THINK_LEADING_OPEN.sub("", text)
    return text.strip()


def clean_output(text: str) -> str:
    """Model text safe to store and send: no ANSI escapes, control characters (newlines and
    tabs kept), NULs, lone surrogates or bidi overrides/isolates."""
    text = _ANSI.sub("", text)
    out = []
    for ch in text:
        if ch in "\n\t":
            out.append(ch)
        elif ch in _BIDI_CONTROLS or unicodedata.category(ch) in ("Cc", "Cs"):
            continue
        else:
            out.append(ch)
    return "".join(out)


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

    async def models(self) -> list[str]:
        """The models the primary server offers (GET /models), sorted."""
        page = await self._targets[0].client.models.list()
        return sorted(m.id for m in page.data)

    async def close(self) -> None:
        for target in self._targets:
            await target.client.close()

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, on_text: OnText | None = None
    ) -> Completion:
        problems: list[str] = []
        too_long: str | None = None
        for target in self._targets:
            ep = target.endpoint
            sent = list(messages) if ep.system_role else merge_system(messages)
            payload = [_payload(m) for m in sent]
            for attempt in range(self._config.retries + 1):
                if attempt:
                    delay = self._config.retry_backoff * 2 ** (attempt - 1)
                    await self._sleep(delay * random.uniform(0.5, 1.0))
                try:
                    return await self._attempt(target, payload, max_tokens, on_text)
                except _RETRYABLE as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {describe_error(exc)}")
                    log.warning("LLM attempt %d failed: %s", attempt + 1, problems[-1])
                except _Unusable as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {exc}")
                    log.warning("LLM attempt %d unusable: %s", attempt + 1, problems[-1])
                except openai.APIError as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {describe_error(exc)}")
                    server = _server_message(exc)
                    if isinstance(exc, openai.BadRequestError) and _CONTEXT_ERROR.search(server):
                        too_long = server[:300]
                        log.warning(
                            "LLM server %s says the prompt is too long: %s. Fix: lower "
                            "context_tokens, or raise the server's context (--n_ctx, num_ctx)",
                            ep.base_url,
                            too_long,
                        )
                    else:
                        log.warning("LLM endpoint unusable, trying the next: %s", problems[-1])
                    break
        if too_long is not None:
            raise ContextTooLong(too_long)
        raise LLMUnavailable(
            "no LLM endpoint answered: "
            + "; ".join(problems[-4:])
            + ". Fix: check that the server is running and the model is pulled "
            "(e.g. `ollama pull <model>`), or configure llm.fallbacks."
        )

    async def _attempt(
        self,
        target: _Target,
        payload: list[dict[str, Any]],
        max_tokens: int,
        on_text: OnText | None = None,
    ) -> Completion:
        shown = ""

        async def grown(raw: str) -> None:
            """The visible answer so far (cleaned, reasoning stripped), when it changed."""
            nonlocal shown
            assert on_text is not None
            text = clean_output(raw)
            text = strip_thinking(text) if self._config.strip_thinking else text.strip()
            text = text[:MAX_ANSWER_CHARS]
            if text != shown:
                shown = text
                await on_text(text)

        if on_text is not None:
            await on_text("")  # a retry or a fallback starts from nothing
        deadline = self._config.connect_timeout + 2 * self._config.read_timeout
        async with asyncio.timeout(deadline):
            chosen = MODEL_CHOICE.get() if target is self._targets[0] else None
            async with target.client.chat.completions.with_streaming_response.create(
                model=chosen or target.endpoint.model,
                messages=payload,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=self._config.temperature,
                stream=True,
            ) as resp:
                kind = resp.http_response.headers.get("content-type", "")
                try:
                    if "text/event-stream" in kind:
                        raw, finish, model = await _read_stream(
                            resp.iter_lines(), on_raw=grown if on_text is not None else None
                        )
                    else:  # a server that ignores stream=true, or an error page with status 200
                        raw, finish, model = _read_json(await resp.read())
                except (_Unusable, asyncio.CancelledError):
                    raise
                except Exception as exc:  # the HTTP library's own errors while reading a body
                    if "timeout" in type(exc).__name__.lower():
                        raise TimeoutError("no byte within read_timeout") from exc
                    raise _Unusable(f"the answer broke off ({type(exc).__name__})") from exc
        text = clean_output(raw)
        text = strip_thinking(text) if self._config.strip_thinking else text.strip()
        if not text:
            raise _Unusable("empty answer")
        truncated = finish == "length"
        if len(text) > MAX_ANSWER_CHARS:
            text, truncated = text[: MAX_ANSWER_CHARS - len(TRUNCATED_MARK)], True
        if truncated:
            text = text.rstrip() + TRUNCATED_MARK
        return Completion(text=text, model=model or target.endpoint.model, truncated=truncated)


def _payload(message: ChatMessage) -> dict[str, Any]:
    """One chat message; with images, OpenAI content parts (text first, then image_url)."""
    if not message.images:
        return {"role": message.role, "content": message.content}
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in message.images]
    return {"role": message.role, "content": parts}


class _Unusable(Exception):
    """The server answered, but not with a usable chat completion."""


async def _read_stream(
    lines: Any, *, on_raw: Callable[[str], Awaitable[None]] | None = None
) -> tuple[str, str | None, str]:
    """Concatenated content deltas, the finish reason and the model from an SSE stream;
    ``on_raw`` (streamed answers) gets the text so far after each delta."""
    parts: list[str] = []
    finish: str | None = None
    model = ""
    events = 0
    async for line in lines:
        if not line.startswith("data:"):
            continue  # comments, event names, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise _Unusable("a stream event that is not JSON") from None
        if not isinstance(chunk, dict):
            raise _Unusable("a stream event that is not an object")
        if "error" in chunk:
            raise _Unusable(f"error in stream: {str(chunk['error'])[:200]}")
        events += 1
        model = str(chunk.get("model") or model)
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                parts.append(content)
                if on_raw is not None and content:
                    await on_raw("".join(parts))
            finish = choice.get("finish_reason") or finish
    if not events:
        raise _Unusable("no completion in the stream")
    return "".join(parts), finish, model


def _read_json(body: bytes) -> tuple[str, str | None, str]:
    try:
        doc = json.loads(body)
    except ValueError:
        looks = "an HTML page" if body.lstrip()[:1] == b"<" else "not JSON"
        raise _Unusable(f"the answer was {looks}") from None
    if not isinstance(doc, dict):
        raise _Unusable("the answer was not a JSON object")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Unusable("no choices in the answer")
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise _Unusable("no message content in the answer")
    return content, choices[0].get("finish_reason"), str(doc.get("model") or "")


def _server_message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner.get("code") or inner)
        return str(inner)
    return str(exc.message)


def describe_error(exc: BaseException) -> str:
    """A short, text-free description of an openai client error (for logs and messages)."""
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIConnectionError):
        return "connection failed"
    return type(exc).__name__
