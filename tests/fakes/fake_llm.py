"""Fake OpenAI-compatible server on 127.0.0.1 (aiohttp.web): real HTTP for the real openai client.

Scripted behaviour per request (consumed in order, then ``default``):
  "ok" | "stream" | ("status", code, body) | ("sleep", seconds) | ("reply", text)
``reply_fn`` (if set) computes the answer from the request body, e.g. to echo the prompt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

Behaviour = Any


class FakeLLM:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[Behaviour] = []
        self.reply = "Hello from fake"
        self.reply_fn: Callable[[dict[str, Any]], str] | None = None
        self.in_flight = 0
        self.peak_in_flight = 0
        self.cancelled = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "messages" in r]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        except asyncio.CancelledError:
            self.cancelled += 1  # the client went away (as Ollama sees a dropped request)
            raise
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        beh = self.script.pop(0) if self.script else ("stream" if body.get("stream") else "ok")
        text = self.reply_fn(body) if self.reply_fn else self.reply
        if isinstance(beh, tuple) and beh[0] == "status":
            return web.json_response(beh[2], status=beh[1])
        if isinstance(beh, tuple) and beh[0] == "sleep":
            await asyncio.sleep(beh[1])
        if isinstance(beh, tuple) and beh[0] == "reply":
            text = beh[1]
        created = int(time.time())
        if beh == "stream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i, piece in enumerate(text.split(" ")):
                delta = ({"role": "assistant"} if i == 0 else {}) | {
                    "content": (" " if i else "") + piece
                }
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
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
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "fake", "object": "model", "created": 0}]}
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
