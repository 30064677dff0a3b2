"""!forget (another gateway, or the store directly) while a turn waits for the model: the turn
ends quietly. It used to tell the person "I could not save my answer (storage problem)" and
log an ERROR for a normal event (the answer's conversation was gone)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM


async def test_a_turn_whose_conversation_was_forgotten_ends_quietly(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.say("hello")
        fake_llm.script = [("sleep", 1.0)]
        fake_llm.reply = "an answer nobody should store"
        with caplog.at_level(logging.INFO):
            await h.transport.say("tell me a story")
            for _ in range(2000):
                if fake_llm.in_flight:
                    break
                await asyncio.sleep(0.005)
            assert fake_llm.in_flight
            report = await h.store.forget_person(h.transport.name, "alice")
            assert report.messages >= 3
            await h.app.responder.wait_idle()
        texts = h.transport.texts()
        assert not any("storage problem" in t for t in texts)
        assert not any(r.levelno >= logging.ERROR for r in caplog.records)
        assert (await h.store.stats())["messages"] == 0  # nothing came back
    finally:
        await h.app.close()
