"""Reading an OpenAI-compatible chat answer from the HTTP body, as it arrives.

Owns the parsing of both shapes a server answers in: server-sent events (``read_lines``
then ``read_stream``) and one plain JSON completion (``read_body`` then ``read_json``), and
the exceptions that say what was wrong with a body. ``bot.llm.openai_compat`` decides what
each of them means for the attempt (retry, next endpoint, ``ContextTooLong``).

Invariants:
- Memory is bounded whatever a server sends: the body is read as it arrives, never whole.
  One stream line over ``MAX_LINE_BYTES`` or a plain JSON answer over ``MAX_JSON_BYTES`` is
  ``Unusable`` (no chat answer is that large), read no further; a stream stops being read
  once its text reaches the caller's ``max_chars`` (finish reason ``length``), so the caller
  closes the connection, which stops generation.
- A stream is complete only when the server says so (``[DONE]`` or a ``finish_reason``); one
  that ends before is ``CutRaw`` with the text so far. A body with no line at all is
  ``Empty`` (llama-cpp-python's answer to an over-long streamed prompt), never an answer.
- The server saying the prompt exceeds its context (an error event or error object in
  ``CONTEXT_ERROR`` words, or ``"truncated": true``) is ``TooLong``; anything else that is
  not a chat completion (not JSON, an HTML page, an error, no choices, no content) is
  ``Unusable``. Nothing here retries, logs or touches the connection.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

MAX_LINE_BYTES = 1 << 20  # one SSE line (a delta is a few hundred bytes)
# a whole non-streamed answer (the adapter's MAX_RAW_CHARS of text, JSON-escaped, fits)
MAX_JSON_BYTES = 1 << 20
CONTEXT_ERROR = re.compile(
    r"context_length_exceeded|context (?:length|window|size)|maximum context|n_ctx|too many tokens"
    r"|exceeds? the (?:available )?context",
    re.IGNORECASE,
)


class Unusable(Exception):
    """The server answered, but not with a usable chat completion."""


class TooLong(Exception):
    """The server said, in a form other than HTTP 400, that the prompt exceeds its context."""

    def __init__(self, server_message: str) -> None:
        super().__init__(server_message)
        self.server_message = server_message


class CutRaw(Exception):
    """The stream ended before the server said the answer was complete."""

    def __init__(self, raw: str, model: str) -> None:
        super().__init__("the stream broke off")
        self.raw = raw
        self.model = model


class Empty(str):
    """An SSE body with no event at all (llama-cpp-python's over-long streamed prompt)."""


async def read_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a body as it arrives (LF or CRLF); a line longer than ``MAX_LINE_BYTES``
    is ``Unusable``, so a server that never sends a newline cannot fill the memory."""
    pending = b""
    async for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r").decode("utf-8", errors="replace")
        if len(pending) > MAX_LINE_BYTES:
            raise Unusable(f"a stream line over {MAX_LINE_BYTES} bytes")
    if pending:
        yield pending.removesuffix(b"\r").decode("utf-8", errors="replace")


async def read_body(chunks: AsyncIterator[bytes]) -> bytes:
    """A whole (non-streamed) body of at most ``MAX_JSON_BYTES``; larger is ``Unusable``."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > MAX_JSON_BYTES:
            raise Unusable(
                f"an answer over {MAX_JSON_BYTES >> 20} MB, not streamed (the server ignores "
                "max_tokens and stream)"
            )
        parts.append(chunk)
    return b"".join(parts)


async def read_stream(
    lines: AsyncIterator[str],
    *,
    max_chars: int,
    on_raw: Callable[[str], Awaitable[None]] | None = None,
    on_usage: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[str, str | None, str]:
    """Concatenated content deltas, the finish reason and the model from an SSE stream;
    ``on_raw`` (streamed answers) gets the text so far after each delta. Returns ``Empty``
    for a body with no line at all; raises ``CutRaw`` when the body ends before ``[DONE]``
    or a ``finish_reason`` (a close-delimited connection cut mid-answer). Stops reading at
    ``max_chars`` of text, finish reason ``length`` (the caller closes the stream)."""
    parts: list[str] = []
    size = 0
    finish: str | None = None
    model = ""
    events = 0
    done = False
    seen = 0
    async for line in lines:
        seen += 1
        if not line.startswith("data:"):
            continue  # comments, event names, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise Unusable("a stream event that is not JSON") from None
        if not isinstance(chunk, dict):
            raise Unusable("a stream event that is not an object")
        if "error" in chunk:
            said = error_text(chunk["error"])
            if CONTEXT_ERROR.search(said):
                raise TooLong(said)
            raise Unusable(f"error in stream: {said[:200]}")
        if chunk.get("truncated") is True:  # llama.cpp: the prompt was cut to fit n_ctx
            raise TooLong("the server truncated the prompt to fit its context (n_ctx)")
        events += 1
        model = str(chunk.get("model") or model)
        if on_usage is not None and isinstance(chunk.get("usage"), dict):
            on_usage(chunk["usage"])  # include_usage: the last chunk, its choices empty
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                content = content[: max_chars - size]
                parts.append(content)
                size += len(content)
                if on_raw is not None and content:
                    await on_raw("".join(parts))
            finish = choice.get("finish_reason") or finish
        if size >= max_chars:  # enough: read no more of what the server writes
            finish, done = "length", True
            break
    if not seen:
        return Empty(""), None, model
    if not events:
        raise Unusable("no completion in the stream")
    if not done and finish is None:
        raise CutRaw("".join(parts), model)
    return "".join(parts), finish, model


def error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or error)
    return str(error)


def read_json(
    body: bytes, *, on_usage: Callable[[dict[str, Any]], None] | None = None
) -> tuple[str, str | None, str]:
    try:
        doc = json.loads(body)
    except ValueError:
        looks = "an HTML page" if body.lstrip()[:1] == b"<" else "not JSON"
        raise Unusable(f"the answer was {looks}") from None
    if not isinstance(doc, dict):
        raise Unusable("the answer was not a JSON object")
    if "error" in doc and "choices" not in doc:  # an error object with status 200
        said = error_text(doc["error"])
        if CONTEXT_ERROR.search(said):
            raise TooLong(said)
        raise Unusable(f"an error with status 200: {said[:200]}")
    if doc.get("truncated") is True:  # llama.cpp: the prompt was cut to fit n_ctx
        raise TooLong("the server truncated the prompt to fit its context (n_ctx)")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Unusable("no choices in the answer")
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise Unusable("no message content in the answer")
    if on_usage is not None and isinstance(doc.get("usage"), dict):
        on_usage(doc["usage"])
    return content, choices[0].get("finish_reason"), str(doc.get("model") or "")
