"""An OpenAI-compatible server that answers with a huge body (issue 43), on 127.0.0.1.

``/v1/chat/completions`` answers ``total`` bytes, written as it goes in ``chunk`` pieces, as
server-sent events (``stream=True``: one delta of ``word`` per event, no end unless the whole
body went out) or as one JSON completion whose content is that long (``stream=False``). It
counts what it managed to write (``sent``): a client that stops reading and hangs up makes the
writes fail, so ``sent`` stays far below ``total`` (``answered`` is set when the handler
ends either way). ``serve_forever`` runs it on its own loop
(the bench's child processes talk to it from outside).
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web


class FloodLLM:
    def __init__(self, *, total: int, stream: bool = True, chunk: int = 64 * 1024) -> None:
        self.total = total
        self.stream = stream
        self.chunk = chunk
        self.sent = 0
        self.answered = asyncio.Event()  # the handler ended (body written, or the client left)
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _pieces(self) -> tuple[bytes, bytes, bytes]:
        """(head, repeated unit, tail) of the body."""
        if self.stream:
            event = {"id": "f", "object": "chat.completion.chunk", "model": "fake",
                     "choices": [{"index": 0, "delta": {"content": "flood "},
                                  "finish_reason": None}]}  # fmt: skip
            return b"", f"data: {json.dumps(event)}\n\n".encode(), b"data: [DONE]\n\n"
        head = b'{"id": "f", "object": "chat.completion", "model": "fake", "choices": [{"index"'
        head += b': 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "'
        return head, b"flood ", b'"}}]}'

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        head, unit, tail = self._pieces()
        ctype = "text/event-stream" if self.stream else "application/json"
        resp = web.StreamResponse(headers={"Content-Type": ctype})
        await resp.prepare(request)
        block = unit * max(1, self.chunk // len(unit))
        try:
            await resp.write(head)
            self.sent = len(head)
            while self.sent + len(block) + len(tail) <= self.total:
                await resp.write(block)
                self.sent += len(block)
            await resp.write(tail)
            self.sent += len(tail)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):  # the client hung up: what we wanted to see
            pass
        finally:
            self.answered.set()
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
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
            self._runner = None


def serve_forever(flood: FloodLLM, started: threading.Event | None = None) -> None:
    """Run ``flood`` on a new event loop in this thread until the process ends."""
    loop = asyncio.new_event_loop()
    loop.run_until_complete(flood.start())
    if started is not None:
        started.set()
    loop.run_forever()
