"""The fake LLM treats a client hanging up as a hang-up, not a server error (bench.pipeline's
output had an aiohttp traceback per cancelled background request), and still reports real
errors. aiohttp raises ``ClientConnectionResetError("Cannot write to closing transport")``
from a write when the client went away before the handler's cancel landed; here that write
error is produced on purpose after the stream started, over a real connection."""

from __future__ import annotations

import contextlib
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError

from tests.fakes.fake_llm import FakeLLM

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def _post(fake: FakeLLM) -> None:
    """One streamed request; here the client stays, so it may read a broken answer (in the
    world it has gone away and reads nothing)."""
    async with aiohttp.ClientSession() as session:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.post(fake.base_url + "/chat/completions", json=BODY) as resp:
                await resp.read()


async def test_a_write_to_a_closing_client_is_a_hang_up_not_a_traceback(
    fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    async def closing(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        raise ClientConnectionResetError("Cannot write to closing transport")

    fake_llm._answer = closing  # type: ignore[method-assign]
    with caplog.at_level("DEBUG", logger="aiohttp"):
        await _post(fake_llm)
    assert fake_llm.events == [("start", 0), ("disconnect", 0)]
    assert fake_llm.disconnected == [0]
    assert not [r for r in caplog.records if r.name.startswith("aiohttp") and r.exc_info]


async def test_a_real_error_in_the_fake_is_still_reported(
    fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        raise RuntimeError("a bug in the fake")

    fake_llm._answer = broken  # type: ignore[method-assign]
    with caplog.at_level("DEBUG", logger="aiohttp"):
        await _post(fake_llm)
    assert any("a bug in the fake" in repr(r.exc_info) for r in caplog.records if r.exc_info)
    assert fake_llm.disconnected == []
