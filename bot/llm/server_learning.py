"""Learning from a server's own answers what it takes and how it counts (the adapter's part).

``bot.llm.openai_compat`` hands each endpoint's client here for two things it learns once per
server and model and keeps in the ``ServerRecord`` (across restarts):
- the structured-output mode (``bot.llm.structured``), tried on a tiny request
  (``structured.PROBE_MESSAGES``, one token) before a real prompt is sent in it, so a refusal
  never costs an evaluation of the real prompt;
- the ratio of the server's ``usage.prompt_tokens`` to our count of the same messages. The
  adapter asks for usage in the stream (``INCLUDE_USAGE``, taken by OpenAI, vLLM, llama-server
  and Ollama); a server whose stream carries none (llama-cpp-python) is asked once more, not
  streamed, for one token, while the ratio is not settled: it holds the prompt in its cache,
  so that costs one token, not an evaluation.

Invariants:
- Nothing here raises to the caller for a server's failure: a probe or a count that fails
  decides nothing (the real request then learns the mode as before; the count waits for the
  next answer).
- Counts are ours exactly as budgets count a prompt: each message's text plus
  ``MESSAGE_OVERHEAD``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import openai

from bot.config import Endpoint
from bot.llm import structured
from bot.llm.port import JsonSchema
from bot.llm.server_record import MIN_RATIO_TOKENS, ServerRecord
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter

log = logging.getLogger("bot.llm")

INCLUDE_USAGE = {"stream_options": {"include_usage": True}}


class ServerLearning:
    def __init__(self, *, record: ServerRecord, counter: TokenCounter, timeout: float) -> None:
        self._record = record
        self._counter = counter
        self._timeout = timeout

    def known_mode(self, endpoint: Endpoint) -> int | None:
        """The index in ``structured.MODES`` this server took before (None: not known)."""
        mode = self._record.structured_mode(endpoint.base_url, endpoint.model)
        return structured.MODES.index(mode) if mode in structured.MODES else None

    def keep_mode(self, endpoint: Endpoint, mode: int) -> None:
        self._record.set_structured_mode(endpoint.base_url, endpoint.model, structured.MODES[mode])

    async def probe_mode(
        self, client: openai.AsyncOpenAI, endpoint: Endpoint, mode: int, schema: JsonSchema
    ) -> int:
        """The first mode from ``mode`` on that the server takes on a tiny request, kept; a
        probe that fails otherwise (the server down) returns the mode it was trying."""
        while structured.MODES[mode] != "plain":
            name = structured.MODES[mode]
            try:
                async with asyncio.timeout(self._timeout):
                    await client.chat.completions.create(
                        model=endpoint.model,
                        messages=structured.PROBE_MESSAGES,  # type: ignore[arg-type]
                        max_tokens=1,
                        stream=False,
                        extra_body=structured.request_fields(name, schema),
                    )
            except openai.APIStatusError as exc:
                if not structured.rejected(exc.status_code, server_message(exc)):
                    return mode
                log.info("LLM server %s does not take response_format %s (HTTP %d, a one-token "
                         "probe); using %s", endpoint.base_url, name, exc.status_code,
                         structured.MODES[mode + 1])  # fmt: skip
                mode += 1
                continue
            except (openai.APIError, TimeoutError):
                return mode
            break
        self.keep_mode(endpoint, mode)
        return mode

    async def count(
        self,
        client: openai.AsyncOpenAI,
        endpoint: Endpoint,
        model: str,
        payload: list[dict[str, Any]],
        usage: dict[str, Any],
    ) -> None:
        """Keep the server's count of this prompt beside ours; without ``usage`` (a stream
        that carried none) ask once more for one token while the ratio is not settled."""
        ours = sum(self._counter.count(_text_of(m["content"])) + MESSAGE_OVERHEAD for m in payload)
        base = endpoint.base_url
        theirs = usage.get("prompt_tokens")
        if not isinstance(theirs, int) and (
            ours >= MIN_RATIO_TOKENS and not self._record.ratio_settled(base, model)
        ):
            try:
                async with asyncio.timeout(self._timeout):
                    answer = await client.chat.completions.create(
                        model=model,
                        messages=payload,  # type: ignore[arg-type]
                        max_tokens=1,
                        stream=False,
                    )
            except (openai.APIError, TimeoutError) as exc:
                log.debug("the server's token count could not be asked: %s", type(exc).__name__)
                return
            theirs = getattr(getattr(answer, "usage", None), "prompt_tokens", None)
        if isinstance(theirs, int):
            self._record.heard_usage(base, model, ours=ours, theirs=theirs)


def _text_of(content: Any) -> str:
    """The text of a message's content (a string, or OpenAI parts: their text parts)."""
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content if isinstance(p, dict))


def server_message(exc: openai.APIError) -> str:
    """What the server said in an error answer (its message; no prompt text)."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner.get("code") or inner)
        return str(inner)
    return str(exc.message)
