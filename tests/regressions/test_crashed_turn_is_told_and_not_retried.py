"""Regression: a turn that crashed on something unexpected (a transport bug here) used to send
nothing and leave the message 'pending', so every restart retried it and crashed again."""

from __future__ import annotations

from pathlib import Path

from bot.domain import ReplyKind
from bot.responder import INTERNAL_ERROR
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport


class BuggyTransport(FakeTransport):
    def fit(self, text: str) -> str:
        if "BOOM" in text:
            raise RuntimeError("a bug in the transport's text fitting")
        return super().fit(text)


async def test_crashed_turn_is_told_and_marked_failed(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "BOOM"
    h = await start_harness(tmp_path, fake_llm, transport=BuggyTransport())
    try:
        await h.say("hello")
        assert h.transport.texts() == [INTERNAL_ERROR]
        assert h.transport.sent[0].kind is ReplyKind.NOTICE
        rows = await h.store._all("SELECT role, text, status FROM messages ORDER BY id")
        assert [tuple(r) for r in rows] == [("user", "hello", "failed")]
        assert await h.app.responder.recover_pending() == 0
    finally:
        await h.app.close()
