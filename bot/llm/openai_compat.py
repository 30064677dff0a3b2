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
- Overflow in every form is ``ContextTooLong``, never an outage: HTTP 400 in the server's
  wording (``body.CONTEXT_ERROR``), an error event inside the stream, a prompt the server
  reports it truncated (``"truncated": true``), and a streamed HTTP 200 with an empty body
  (llama-cpp-python's answer to an over-long streamed prompt): an empty stream is asked
  again once, not streamed, with ``max_tokens: 1``, and the server's answer to that decides
  (its 400 names the context; a success means the prompt fits, and the attempt failed).
- A stream is complete only when the server says so (``[DONE]`` or a ``finish_reason``). A
  connection that ends before (a close-delimited HTTP/1.0-style stream cut mid-answer) is a
  failed attempt, retried; when no attempt completes, the longest cut answer is returned
  marked ``cut`` and ending with ``CUT_MARK``, so the person sees it broke off, and it is
  never stored as a whole answer.
- Every ``LLMUnavailable`` names the fix for what failed last: the server down, a 404 (the
  model is not pulled, or base_url lacks ``/v1``), a refused key.
- ``connection_lost`` (if given) is called when an attempt could not reach the server, so the
  learned server limits are looked up again once it is back (``bot.llm.server_limits``).
- Model output is cleaned before anyone stores or sends it: ANSI escape sequences, control
  characters (NUL included; newlines and tabs kept) and bidi overrides/isolates are removed.
  Over-long answers are cut to ``MAX_ANSWER_CHARS``; an answer cut by ``max_tokens`` (or here)
  ends with ``TRUNCATED_MARK``.
- Memory is bounded whatever a server sends: the body is read as it arrives, never whole
  (``bot.llm.body``). A stream stops being read (and the connection is closed, which stops
  generation) once its text reaches ``MAX_RAW_CHARS`` (the answer is then cut, as by
  ``max_tokens``); one stream line over ``body.MAX_LINE_BYTES`` or a plain JSON answer over
  ``body.MAX_JSON_BYTES`` is a failed attempt (no chat answer is that large), read no further.
- ``complete(schema=...)`` asks for structured output in the endpoint's mode
  (bot.llm.structured); a server that refuses a mode is asked in the next one at once (the
  refusal is no failed attempt), down to a plain request.
- With a ``record`` and a ``counter``, what a server takes and how it counts is learned once
  per server and model and kept (``bot.llm.server_learning``): the mode on a one-token probe
  before a real prompt, and ``usage.prompt_tokens`` beside our count of each prompt.
- ``system_role: false`` on an endpoint merges the system message into the first user message
  (templates without a system role).
- Secrets come from the environment variable named by ``api_key_env``; servers that need no
  key (Ollama) get a placeholder, because the openai client refuses to start without one.
"""

from __future__ import annotations

import asyncio
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
from bot.llm import structured
from bot.llm.body import (
    CONTEXT_ERROR,
    CutRaw,
    Empty,
    TooLong,
    Unusable,
    read_body,
    read_json,
    read_lines,
    read_stream,
)
from bot.llm.port import (
    CUT_MARK,
    TRUNCATED_MARK,
    ChatMessage,
    Completion,
    ContextTooLong,
    JsonSchema,
    OnText,
    merge_system,
)
from bot.llm.server_learning import INCLUDE_USAGE, ServerLearning
from bot.llm.server_learning import server_message as _server_message
from bot.llm.server_record import ServerRecord
from bot.llm.tokens import TokenCounter

log = logging.getLogger("bot.llm")

MAX_ANSWER_CHARS = 16_000
# What is read of one answer: room for reasoning (<think>) before MAX_ANSWER_CHARS of answer.
MAX_RAW_CHARS = 4 * MAX_ANSWER_CHARS
PLACEHOLDER_KEY = "not-needed"

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_LEADING_OPEN = re.compile(r"\A\s*<think>(?!.*</think>).*\Z", re.DOTALL | re.IGNORECASE)
_THINK_CLOSE = re.compile(r"\A.*?</think>", re.DOTALL | re.IGNORECASE)
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

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


@dataclass(slots=True)
class _Target:
    endpoint: Endpoint
    client: openai.AsyncOpenAI
    mode: int = 0  # index into structured.MODES: the first this server did not refuse
    mode_known: bool = False  # the mode was taken by this server (here or in the record)


class OpenAICompatLLM:
    def __init__(
        self,
        *,
        config: LLMConfig,
        env: Mapping[str, str],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        connection_lost: Callable[[], None] | None = None,
        counter: TokenCounter | None = None,
        record: ServerRecord | None = None,
    ) -> None:
        self._config = config
        self._sleep = sleep
        self._connection_lost = connection_lost
        # the structured-output mode and the token ratio, learned once per server and model
        self._learning = (
            ServerLearning(record=record, counter=counter, timeout=config.connect_timeout
                           + config.read_timeout)
            if record is not None and counter is not None else None
        )  # fmt: skip
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
        for target in self._targets:
            known = self._learning.known_mode(target.endpoint) if self._learning else None
            if known is not None:
                target.mode, target.mode_known = known, True

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
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
        model: str | None = None,
    ) -> Completion:
        problems: list[str] = []
        too_long: str | None = None
        cut: Completion | None = None  # the longest answer a server broke off
        fix = FIX_DOWN
        for target in self._targets:
            ep = target.endpoint
            sent = list(messages) if ep.system_role else merge_system(messages)
            payload = [_payload(m) for m in sent]
            for attempt in range(self._config.retries + 1):
                if attempt:
                    delay = self._config.retry_backoff * 2 ** (attempt - 1)
                    await self._sleep(delay * random.uniform(0.5, 1.0))
                try:
                    chosen = model if target is self._targets[0] else None  # fallbacks: theirs
                    return await self._structured(
                        target, payload, max_tokens, on_text, schema, chosen=chosen
                    )
                except _RETRYABLE as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {describe_error(exc)}")
                    log.warning("LLM attempt %d failed: %s", attempt + 1, problems[-1])
                    fix = FIX_DOWN
                    lost = isinstance(exc, openai.APIConnectionError | TimeoutError)
                    if lost and self._connection_lost is not None:
                        self._connection_lost()
                except TooLong as exc:
                    too_long = exc.server_message[:300]
                    problems.append(f"{ep.base_url} ({ep.model}): prompt too long")
                    log.warning(
                        "LLM server %s says the prompt is too long: %s. The turn is rebuilt "
                        "smaller; to keep more history raise the server's context (--n_ctx, "
                        "num_ctx) or lower context_tokens", ep.base_url, too_long,
                    )  # fmt: skip
                    break
                except _Cut as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): the stream broke off")
                    log.warning("LLM attempt %d: the server ended the stream before the "
                                "answer was complete (no [DONE], no finish_reason)",
                                attempt + 1)  # fmt: skip
                    if exc.completion is not None and (
                        cut is None or len(exc.completion.text) > len(cut.text)
                    ):
                        cut = exc.completion
                except Unusable as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {exc}")
                    log.warning("LLM attempt %d unusable: %s", attempt + 1, problems[-1])
                    fix = FIX_DOWN
                except openai.APIError as exc:
                    problems.append(f"{ep.base_url} ({ep.model}): {describe_error(exc)}")
                    server = _server_message(exc)
                    if isinstance(exc, openai.BadRequestError) and CONTEXT_ERROR.search(server):
                        too_long = server[:300]
                        log.warning(
                            "LLM server %s says the prompt is too long: %s. The turn is "
                            "rebuilt smaller; to keep more history raise the server's context "
                            "(--n_ctx, num_ctx) or lower context_tokens", ep.base_url, too_long,
                        )  # fmt: skip
                    else:
                        fix = fix_for(exc, ep)
                        log.warning("LLM endpoint unusable, trying the next: %s. Fix: %s",
                                    problems[-1], fix)  # fmt: skip
                    break
        if too_long is not None:
            raise ContextTooLong(too_long)
        if cut is not None:
            log.warning("no attempt completed; the longest cut answer (%d chars) is sent "
                        "marked as broken off", len(cut.text))  # fmt: skip
            return cut
        raise LLMUnavailable(
            "no LLM endpoint answered: " + "; ".join(problems[-4:]) + f". Fix: {fix}"
        )

    async def _structured(
        self,
        target: _Target,
        payload: list[dict[str, Any]],
        max_tokens: int,
        on_text: OnText | None,
        schema: JsonSchema | None,
        *,
        chosen: str | None = None,
    ) -> Completion:
        """One attempt (``chosen``: the model asked instead of the endpoint's); with a schema,
        in the endpoint's structured-output mode, moving on to the next mode
        (bot.llm.structured) when the server refuses this one."""
        if schema is not None and not target.mode_known and self._learning is not None:
            target.mode = await self._learning.probe_mode(
                target.client, target.endpoint, target.mode, schema
            )
            target.mode_known = True
        while True:
            mode = structured.MODES[target.mode] if schema is not None else "plain"
            extra = structured.request_fields(mode, schema)
            try:
                return await self._attempt(
                    target, payload, max_tokens, on_text, extra=extra, chosen=chosen
                )
            except openai.APIStatusError as exc:
                if not extra or not structured.rejected(exc.status_code, _server_message(exc)):
                    raise
                target.mode += 1
                log.info(
                    "LLM server %s does not take response_format %s (HTTP %d); using %s",
                    target.endpoint.base_url, mode, exc.status_code,
                    structured.MODES[target.mode],
                )  # fmt: skip
                if self._learning is not None:
                    self._learning.keep_mode(target.endpoint, target.mode)

    async def _attempt(
        self,
        target: _Target,
        payload: list[dict[str, Any]],
        max_tokens: int,
        on_text: OnText | None = None,
        *,
        extra: dict[str, Any] | None = None,
        chosen: str | None = None,
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
        counting = self._learning is not None
        usage: dict[str, Any] = {}
        async with asyncio.timeout(deadline):
            async with target.client.chat.completions.with_streaming_response.create(
                model=chosen or target.endpoint.model,
                messages=payload,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=self._config.temperature,
                stream=True,
                extra_body={**(extra or {}), **INCLUDE_USAGE} if counting else extra or None,
            ) as resp:
                kind = resp.http_response.headers.get("content-type", "")
                try:
                    if "text/event-stream" in kind:
                        raw, finish, model = await read_stream(
                            read_lines(resp.iter_bytes()),
                            max_chars=MAX_RAW_CHARS,
                            on_raw=grown if on_text is not None else None,
                            on_usage=usage.update,
                        )
                    else:  # a server that ignores stream=true, or an error page with status 200
                        raw, finish, model = read_json(
                            await read_body(resp.iter_bytes()), on_usage=usage.update
                        )
                except CutRaw as exc:
                    cut = self._finish_cut(exc.raw, exc.model or target.endpoint.model)
                    raise _Cut(cut) from None
                except (Unusable, TooLong, asyncio.CancelledError):
                    raise
                except Exception as exc:  # the HTTP library's own errors while reading a body
                    if "timeout" in type(exc).__name__.lower():
                        raise TimeoutError("no byte within read_timeout") from exc
                    raise Unusable(f"the answer broke off ({type(exc).__name__})") from exc
            if isinstance(raw, Empty):
                await self._diagnose_empty(target, payload)
        assert isinstance(raw, str)
        text = clean_output(raw)
        text = strip_thinking(text) if self._config.strip_thinking else text.strip()
        if not text:
            raise Unusable("empty answer")
        truncated = finish == "length"
        if len(text) > MAX_ANSWER_CHARS:
            text, truncated = text[: MAX_ANSWER_CHARS - len(TRUNCATED_MARK)], True
        if truncated:
            text = text.rstrip() + TRUNCATED_MARK
        if self._learning is not None:
            model_asked = chosen or target.endpoint.model
            await self._learning.count(target.client, target.endpoint, model_asked, payload, usage)
        return Completion(text=text, model=model or target.endpoint.model, truncated=truncated)

    def _finish_cut(self, raw: str, model: str) -> Completion | None:
        """A broken-off answer as the person may see it: cleaned, marked ``CUT_MARK``."""
        text = clean_output(raw)
        text = strip_thinking(text) if self._config.strip_thinking else text.strip()
        text = text[: MAX_ANSWER_CHARS - len(CUT_MARK)].rstrip()
        if not text:
            return None
        return Completion(text=text + CUT_MARK, model=model, truncated=True, cut=True)

    async def _diagnose_empty(self, target: _Target, payload: list[dict[str, Any]]) -> None:
        """A streamed 200 with nothing in it: llama-cpp-python's answer to a prompt longer
        than its context. Ask once without streaming and one token: a 400 in context words is
        ``TooLong``; anything else leaves the attempt failed as unusable. That server closes
        the connection after an empty stream, and the first request after it may meet the
        closed connection (measured: "connection failed"), so a failed connection is tried
        again twice."""
        for tries in range(3):
            try:
                async with asyncio.timeout(
                    self._config.connect_timeout + self._config.read_timeout
                ):
                    await target.client.chat.completions.create(
                        model=target.endpoint.model,
                        messages=payload,  # type: ignore[arg-type]
                        max_tokens=1,
                        stream=False,
                    )
            except openai.BadRequestError as exc:
                server = _server_message(exc)
                if CONTEXT_ERROR.search(server):
                    raise TooLong(server) from None
                raise Unusable(f"an empty stream, then {describe_error(exc)}") from None
            except openai.APIConnectionError as exc:
                if tries == 2 or isinstance(exc, openai.APITimeoutError):
                    raise Unusable(f"an empty stream, then {describe_error(exc)}") from None
                await self._sleep(0.2 * (tries + 1))
                continue
            except (openai.APIError, TimeoutError) as exc:
                raise Unusable(f"an empty stream, then {describe_error(exc)}") from None
            raise Unusable("an empty stream (the same prompt fits when not streamed)")


def _payload(message: ChatMessage) -> dict[str, Any]:
    """One chat message; with images, OpenAI content parts (text first, then image_url)."""
    if not message.images:
        return {"role": message.role, "content": message.content}
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in message.images]
    return {"role": message.role, "content": parts}


class _Cut(Exception):
    """A cut stream, as the person would see it (None when nothing visible came)."""

    def __init__(self, completion: Completion | None) -> None:
        super().__init__("the stream broke off")
        self.completion = completion


FIX_DOWN = (
    "check that the server is running and answers at llm.base_url (Ollama: sudo systemctl "
    "start ollama), or configure llm.fallbacks"
)


def fix_for(exc: openai.APIError, endpoint: Endpoint) -> str:
    """The fix for an error that retrying cannot fix, in the operator's words."""
    if isinstance(exc, openai.NotFoundError):
        said = _server_message(exc).lower()
        if "model" in said:
            return (
                f"the server has no model {endpoint.model!r}: pull it (Ollama: ollama pull "
                f"{endpoint.model}) or set llm.model to one it has"
            )
        url = endpoint.base_url.rstrip("/")
        if not url.endswith("/v1"):
            return (
                f"HTTP 404 at {url}/chat/completions: base_url should end in /v1: set "
                f"llm.base_url: {url}/v1 (or MESHSAGE_LLM_BASE_URL)"
            )
        return (
            f"HTTP 404 at {url}/chat/completions: check llm.base_url (OpenAI-compatible "
            "servers serve the API under /v1) and that the model is pulled"
        )
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        key = endpoint.api_key_env or "the variable named by llm.api_key_env"
        return f"the server refused the API key: put a valid key in {key}"
    return FIX_DOWN


def describe_error(exc: BaseException) -> str:
    """A short, text-free description of an openai client error (for logs and messages)."""
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIConnectionError):
        return "connection failed"
    return type(exc).__name__
