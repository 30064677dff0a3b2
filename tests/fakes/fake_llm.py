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
``reply_fn`` (if set) computes the answer from the request body, e.g. to echo the prompt.

``/v1/embeddings`` answers with ``hashed_vector``: a bag of lower-cased words hashed into
``EMBED_DIM`` dimensions and normalised, deterministic and carrying meaning (texts that share
words are close), scripted by ``embed_script`` ("ok" | ("status", code, body) | ("sleep", s)).
``stop()`` then ``start(port=same)`` simulates an outage and the server coming back.
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
from typing import Any

from aiohttp import web

Behaviour = Any
EMBED_DIM = 256
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


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
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.models = ["fake"]  # what GET /v1/models lists

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "messages" in r]

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

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        beh: Any = self.script.pop(0) if self.script else "ok"
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
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
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
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
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
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": m, "object": "model", "created": 0} for m in self.models],
            }
        )

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
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
