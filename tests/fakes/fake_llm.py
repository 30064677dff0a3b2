"""Fake OpenAI-compatible server on 127.0.0.1 (aiohttp.web): real HTTP for the real openai client.

Every chat request is logged (``requests``, in arrival order; ``events``: ("start" | "end" |
"disconnect", index)). A request with ``"stream": true`` is answered as server-sent events, one
chunk per word, like llama.cpp; otherwise as one JSON completion. A client that hangs up before
the answer is complete is counted (``cancelled``, ``disconnected`` indices): that is what stops
generation on a real streaming server.

Scripted behaviour per request (consumed in order, then "ok"):
  "ok" | "stream" (force SSE) | ("status", code, body) | ("sleep", seconds) | ("reply", text)
  | ("length", text): finish_reason "length" (cut by max_tokens)
  | ("slow", seconds): that long between streamed words (or before a JSON answer)
  | ("stall", n): stream the first n words, then hold until the client hangs up (a process
    stopped while the model writes)
  | "context_exceeded": HTTP 400 context_length_exceeded, as llama.cpp/OpenAI send it
  | "html": an HTML error page with status 200 | "not_json" | "no_choices" | "no_message"
  | ("raw", content_type, body_bytes)
  | "empty_stream": HTTP 200, text/event-stream, and no body at all (llama-cpp-python's answer
    to an over-long streamed prompt)
  | ("stream_error", message): one SSE error event (``{"error": {...}}``) and the end
  | ("cut", n): the first n words, then the connection closes with no [DONE] and no
    finish_reason, close-delimited (HTTP/1.0-style: no chunked framing, so the client sees a
    clean end of body, not a protocol error)
  | ("truncated", text): a streamed answer whose last chunk says ``"truncated": true``
    (llama.cpp: the prompt was cut to fit its context)
``reply_fn`` (if set) computes the answer from the request body, e.g. to echo the prompt.

``usage.prompt_tokens`` is the fake's own count (``count_prompt``: cl100k times
``token_ratio``), in a JSON answer and, when the request asks for it
(``stream_options.include_usage``, as OpenAI and vLLM take it), in a last streamed chunk with
no choices; ``stream_usage = False`` leaves it out of streams, as llama-cpp-python does.
``refuse_json_schema`` answers a ``json_schema`` response_format with llama-cpp-python's
HTTP 500 validation error, at once (``schema_refusals`` counts them).

Server limits, as real servers tell them (each None/empty by default: the route answers 404,
like llama-cpp-python's server):
- ``n_ctx``: a context size enforced like llama-cpp-python 0.3.36: a prompt of at least
  ``n_ctx`` tokens (counted with cl100k times ``token_ratio``; SmolLM2 counts 4-8% more) is
  refused (with ``n_ctx_holds_answer``: the prompt plus ``max_tokens``; llama-cpp-python
  0.3.36 instead cuts the answer to what is left, which loses it as surely), streamed with
  an empty 200, not streamed with HTTP 400 in its words
  ("This model's maximum context length is N tokens. However, you requested ...");
  ``refused`` counts them.
- ``props`` (llama-server ``GET /props``), ``ollama_show`` (``POST /api/show``),
  ``ollama_ps`` (``GET /api/ps``), ``max_model_len`` (vLLM: in ``/v1/models``).

``/v1/embeddings`` answers with ``hashed_vector``: a bag of lower-cased words hashed into
``EMBED_DIM`` dimensions and normalised, deterministic and carrying meaning (texts that share
words are close), scripted by ``embed_script`` ("ok" | ("status", code, body) | ("sleep", s)).
``stop()`` then ``start(port=same)`` simulates an outage and the server coming back.

``OneSlotLLM`` (below) is the same server made as unkind as a one-slot llama.cpp: one request
at a time, prompt evaluation charged per uncached token and not interruptible, generation at a
set rate that stops when the client hangs up, on a scaled clock.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bot.llm import structured
from bot.llm.gate import PROBE_MARK

Behaviour = Any
EMBED_DIM = 256
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def is_probe(body: dict[str, Any]) -> bool:
    """A request that learns about the server, not about a conversation: the gate's speed
    probe (``bot.llm.gate``) or the structured-output mode probe (``bot.llm.structured``)."""
    messages = body.get("messages") or []
    first = str(messages[0].get("content", "")) if messages else ""
    return first.startswith((PROBE_MARK, structured.PROBE_MARK))


def hashed_vector(text: str, dim: int = EMBED_DIM) -> list[float]:
    """Unit vector of the hashed bag of lower-cased words of ``text`` (zero for no words)."""
    vec = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        vec[int.from_bytes(digest[:4], "little") % dim] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vec))
    return [x / norm for x in vec] if norm else vec


CONTEXT_EXCEEDED = {
    "error": {
        "message": "Requested tokens (5000) exceed context window of 4096",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
MALFORMED: dict[str, tuple[str, bytes]] = {
    "html": ("text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>"),
    "not_json": ("text/plain", b"Internal error, please retry"),
    "no_choices": ("application/json", b'{"id": "c1", "object": "chat.completion", "choices": []}'),
    "no_message": (
        "application/json",
        b'{"id": "c1", "choices": [{"index": 0, "finish_reason": "stop"}]}',
    ),
}


class FakeLLM:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[Behaviour] = []
        self.reply = "Hello from fake"
        self.reply_fn: Callable[[dict[str, Any]], str] | None = None
        self.in_flight = 0
        self.peak_in_flight = 0
        self.cancelled = 0
        self.disconnected: list[int] = []  # indices into ``requests`` whose client hung up
        self.events: list[tuple[str, int]] = []
        self.embed_requests: list[dict[str, Any]] = []
        self.embed_script: list[Behaviour] = []
        self.embeds_answered = 0
        self.n_ctx: int | None = None
        self.token_ratio = 1.0
        self.refused = 0  # prompts refused as longer than n_ctx
        self.prompt_tokens: list[int] = []  # per chat request, by the fake's count
        self.stream_usage = True
        self.n_ctx_holds_answer = False  # True: the prompt and max_tokens must fit n_ctx
        self.refuse_json_schema = False
        self.schema_refusals = 0
        self.props: dict[str, Any] | None = None
        self.ollama_show: dict[str, Any] | None = None
        self.ollama_ps: dict[str, Any] | None = None
        self.max_model_len: int | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.models = ["fake"]  # what GET /v1/models lists

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        """Chat requests about conversations: the gate's speed probes left out (``probes``)."""
        return [r for r in self.requests if "messages" in r and not is_probe(r)]

    def probes(self) -> list[dict[str, Any]]:
        """The gate's small requests that measure the prompt speed (``bot.llm.gate``)."""
        return [r for r in self.requests if is_probe(r)]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        index = -1
        try:
            body = await request.json()
            self.requests.append(body)
            index = len(self.requests) - 1
            self.events.append(("start", index))
            resp = await self._answer(request, body)
            self.events.append(("end", index))
            return resp
        except asyncio.CancelledError:
            self._hung_up(index)  # the client went away (a real server stops generating)
            raise
        except ConnectionResetError:
            # The client hung up while a write was on its way (aiohttp raises "Cannot write to
            # closing transport" before the handler's cancel lands): the same hang-up, not a
            # server error. aiohttp drops this stand-in quietly (the connection is gone);
            # re-raising made it log a traceback per cancelled request (bench.pipeline output).
            self._hung_up(index)
            return web.Response(status=499, text="client closed the request")
        finally:
            self.in_flight -= 1

    def _hung_up(self, index: int) -> None:
        self.cancelled += 1
        self.disconnected.append(index)
        self.events.append(("disconnect", index))

    def count_prompt(self, body: dict[str, Any]) -> int:
        """The prompt's tokens as this fake server counts them (cl100k x ``token_ratio``)."""
        from bot.llm.tokens import MESSAGE_OVERHEAD, make_counter

        counter = make_counter()
        raw = sum(
            counter.count(m["content"] if isinstance(m["content"], str) else json.dumps(m))
            + MESSAGE_OVERHEAD
            for m in body.get("messages", [])
        )
        return math.ceil(raw * self.token_ratio)

    async def _over_context(
        self, request: web.Request, body: dict[str, Any]
    ) -> web.StreamResponse | None:
        """llama-cpp-python's refusal of a prompt longer than ``n_ctx`` (None: it fits)."""
        tokens = self.count_prompt(body)
        self.prompt_tokens.append(tokens)
        held = tokens + (int(body.get("max_tokens") or 0) if self.n_ctx_holds_answer else 0)
        if self.n_ctx is None or held < self.n_ctx:
            return None
        self.refused += 1
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        asked = int(body.get("max_tokens") or 0)
        message = (
            f"This model's maximum context length is {self.n_ctx} tokens. However, you "
            f"requested {tokens + asked} tokens ({tokens} in the messages, {asked} in the "
            "completion). Please reduce the length of the messages or completion."
        )
        return web.json_response(
            {"error": {"message": message, "type": "invalid_request_error",
                       "param": "messages", "code": "context_length_exceeded"}},
            status=400,
        )  # fmt: skip

    async def _cut_close_delimited(
        self, request: web.Request, body: dict[str, Any], text: str, n: int
    ) -> web.StreamResponse:
        """n words as SSE, then the connection closes: no [DONE], no finish_reason, no chunked
        framing (the body ends where the connection does, as with HTTP/1.0)."""
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        events = []
        for i, piece in enumerate(text.split(" ")[:n]):
            chunk = {
                "id": "c1", "object": "chat.completion.chunk", "model": body["model"],
                "choices": [{"index": 0, "delta": {"content": (" " if i else "") + piece},
                             "finish_reason": None}],
            }  # fmt: skip
            events.append(f"data: {json.dumps(chunk)}\n\n".encode())
        transport = request.transport
        assert transport is not None
        transport.write(head + b"".join(events))
        await asyncio.sleep(0.05)  # let the bytes leave before the close
        transport.close()
        return web.Response(status=200)  # never sent: the connection is gone

    def usage_chunk(self, body: dict[str, Any], created: int) -> bytes:
        """The last streamed chunk with the usage, when asked for and given (b"" if not)."""
        asked = (body.get("stream_options") or {}).get("include_usage")
        if not asked or not self.stream_usage:
            return b""
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": created,
                 "model": body["model"], "choices": [], "usage": self.usage(body)}  # fmt: skip
        return f"data: {json.dumps(chunk)}\n\n".encode()

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        tokens = self.count_prompt(body)
        return {"prompt_tokens": tokens, "completion_tokens": 3, "total_tokens": tokens + 3}

    def refuses_schema(self, body: dict[str, Any]) -> web.Response | None:
        """llama-cpp-python's answer to ``json_schema``: HTTP 500, before any evaluation."""
        kind = (body.get("response_format") or {}).get("type")
        if not self.refuse_json_schema or kind != "json_schema":
            return None
        self.schema_refusals += 1
        message = (
            "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
            "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\", "
            "'input': 'json_schema'}"
        )
        return web.json_response({"error": {"message": message}}, status=500)

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if (schema_refusal := self.refuses_schema(body)) is not None:
            return schema_refusal
        refusal = await self._over_context(request, body)
        if refusal is not None:
            return refusal
        if is_probe(body):  # measuring: no script step, no reply_fn
            beh: Any = "ok"
            text = "OK"
        else:
            beh = self.script.pop(0) if self.script else "ok"
            text = self.reply_fn(body) if self.reply_fn else self.reply
        finish = "stop"
        pause = 0.0
        stall: int | None = None
        kind: Any = beh[0] if isinstance(beh, tuple) else beh
        if kind == "status":
            return web.json_response(beh[2], status=beh[1])
        if kind == "context_exceeded":
            return web.json_response(CONTEXT_EXCEEDED, status=400)
        if kind == "raw":
            return web.Response(body=beh[2], content_type=beh[1])
        if kind == "empty_stream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        if kind == "stream_error":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            error = {"error": {"message": beh[1], "type": "server_error"}}
            await resp.write(f"data: {json.dumps(error)}\n\n".encode())
            await resp.write_eof()
            return resp
        if kind == "cut":
            return await self._cut_close_delimited(request, body, text, int(beh[1]))
        truncated_prompt = kind == "truncated"
        if truncated_prompt:
            text = beh[1]
        if kind in MALFORMED:
            ctype, raw = MALFORMED[kind]
            return web.Response(body=raw, content_type=ctype)
        if kind == "sleep":
            await asyncio.sleep(beh[1])
        if kind == "reply":
            text = beh[1]
        if kind == "length":
            text, finish = beh[1], "length"
        if kind == "slow":
            pause = beh[1]
        if kind == "stall":
            stall = int(beh[1])
        created = int(time.time())
        if beh == "stream" or body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            pieces = text.split(" ")
            for i, piece in enumerate(pieces):
                if i == stall:
                    await asyncio.Event().wait()  # until the client goes away (cancelled)
                if pause:
                    await asyncio.sleep(pause)
                delta = ({"role": "assistant"} if i == 0 else {}) | {
                    "content": (" " if i else "") + piece
                }
                last = i == len(pieces) - 1
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "delta": delta, "finish_reason": finish if last else None}
                    ],
                }
                if last and truncated_prompt:
                    chunk["truncated"] = True
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(self.usage_chunk(body, created) + b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if pause:
            await asyncio.sleep(pause)
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": created,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": finish,
                    }
                ],
                "usage": self.usage(body),
            }
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.embed_requests.append(body)
        beh = self.embed_script.pop(0) if self.embed_script else "ok"
        if isinstance(beh, tuple) and beh[0] == "status":
            return web.json_response(beh[2], status=beh[1])
        if isinstance(beh, tuple) and beh[0] == "sleep":
            await asyncio.sleep(beh[1])
        self.embeds_answered += 1
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for i, text in enumerate(texts):
            vec: Any = hashed_vector(text)
            if body.get("encoding_format") == "base64":
                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        data: list[dict[str, Any]] = [
            {"id": m, "object": "model", "created": 0} for m in self.models
        ]
        if self.max_model_len is not None:  # vLLM names each model's context
            for model in data:
                model["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": data})

    def _limits_route(self, name: str) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            doc = getattr(self, name)
            if doc is None:
                return web.json_response({"detail": "Not Found"}, status=404)
            return web.json_response(doc)

        return handler

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/props", self._limits_route("props"))
        app.router.add_post("/api/show", self._limits_route("ollama_show"))
        app.router.add_get("/api/ps", self._limits_route("ollama_ps"))
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


# --- a one-slot server (issue 27) -------------------------------------------------------------
CHARS_PER_TOKEN = 4  # the one-slot fake's tokenizer: every 4 characters of its template


@dataclass
class SlotRecord:
    """One request as the one-slot fake served it (times on its scaled clock)."""

    index: int  # into ``requests``
    kind: str  # "reply" or "background" (``OneSlotLLM.classify``)
    arrived: float
    started: float = math.nan  # the slot was taken
    evaluated_at: float = math.nan  # prompt evaluation done
    ended: float = math.nan
    prompt_tokens: int = 0
    evaluated: int = 0  # prompt tokens not in the cache
    generated: int = 0
    finished: bool = False  # the whole answer was streamed
    hung_up: str = ""  # "" | "evaluating" | "generating"
    behind: list[int] = field(default_factory=list)  # requests served between arrival and start


class OneSlotLLM(FakeLLM):
    """As unkind as a one-slot llama.cpp server: one request at a time (first come, first
    served); prompt evaluation costs ``1 / prompt_rate`` seconds per token not in its cache (the
    previous request's prompt and the answer it generated) and cannot be interrupted (a client
    that hangs up meanwhile still holds the slot until it ends); the answer streams at
    ``gen_rate`` tokens a second, one word a token, cut at ``max_tokens`` (finish "length"),
    and stops when the client hangs up. Times run on a scaled clock: ``clock()`` is seconds of
    the simulated server, ``scale`` real seconds each. Streamed requests only (as the bot
    sends them). ``served`` records each request (``SlotRecord``); a request is a reply unless
    ``is_background`` says it is not, and the gate's speed probes are background too."""

    def __init__(
        self,
        *,
        prompt_rate: float = 150.0,
        gen_rate: float = 20.0,
        scale: float = 0.05,
        is_background: Callable[[dict[str, Any]], bool] = lambda body: False,
    ) -> None:
        super().__init__()
        self.prompt_rate = prompt_rate
        self.gen_rate = gen_rate
        self.scale = scale
        self.is_background = is_background
        self.served: list[SlotRecord] = []
        self.cache = ""  # what the slot holds: the last prompt and what it generated
        self._slot = asyncio.Lock()  # FIFO: asyncio.Lock wakes waiters in order
        self._t0 = time.monotonic()

    def clock(self) -> float:
        return (time.monotonic() - self._t0) / self.scale

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds * self.scale)

    @staticmethod
    def render(messages: list[dict[str, Any]]) -> str:
        """A ChatML-like template: what the slot's cache is compared on."""
        parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
        return "".join(parts) + "<|im_start|>assistant\n"

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        index = len(self.requests) - 1
        kind = "background" if self.is_background(body) or is_probe(body) else "reply"
        record = SlotRecord(index=index, kind=kind, arrived=self.clock())
        self.served.append(record)
        prompt = self.render(body["messages"])
        text = "OK" if is_probe(body) else self.reply_fn(body) if self.reply_fn else self.reply
        async with self._slot:
            record.started = self.clock()
            record.behind = [
                r.index for r in self.served if record.arrived <= r.ended <= record.started
            ]
            shared = _shared_chars(self.cache, prompt)
            record.prompt_tokens = -(-len(prompt) // CHARS_PER_TOKEN)
            record.evaluated = -(-(len(prompt) - shared) // CHARS_PER_TOKEN)
            evaluating = asyncio.ensure_future(self.sleep(record.evaluated / self.prompt_rate))
            try:
                await asyncio.shield(evaluating)
            except asyncio.CancelledError:
                record.hung_up = "evaluating"
                await evaluating  # a server cannot stop evaluating: the slot stays taken
                self.cache = prompt
                record.evaluated_at = record.ended = self.clock()
                raise
            record.evaluated_at = self.clock()
            self.cache = prompt
            words = text.split(" ")[: int(body.get("max_tokens") or 1 << 30)]
            finish = "length" if len(words) < len(text.split(" ")) else "stop"
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            try:
                await resp.prepare(request)
                for i, word in enumerate(words):
                    await self.sleep(1 / self.gen_rate)
                    piece = (" " if i else "") + word
                    chunk = {
                        "id": "c1",
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"content": piece},
                                "finish_reason": finish if i == len(words) - 1 else None,
                            }
                        ],
                    }
                    await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.cache += piece
                    record.generated += 1
                await resp.write(self.usage_chunk(body, int(time.time())) + b"data: [DONE]\n\n")
                await resp.write_eof()
                record.finished = True
            except (asyncio.CancelledError, ConnectionResetError):
                record.hung_up = "generating"
                raise
            finally:
                record.ended = self.clock()
            return resp

    def replies(self) -> list[SlotRecord]:
        return [r for r in self.served if r.kind == "reply"]

    def background(self) -> list[SlotRecord]:
        return [r for r in self.served if r.kind == "background"]

    def waited_behind_background(self, record: SlotRecord) -> float:
        """Seconds ``record`` waited for the slot while background requests held it."""
        total = 0.0
        if math.isnan(record.started):
            return total
        for other in self.served:
            if other.kind != "background" or other is record or math.isnan(other.started):
                continue
            start = max(other.started, record.arrived)
            end = min(record.started if math.isnan(other.ended) else other.ended, record.started)
            if end > start:
                total += end - start
        return total


def _shared_chars(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
