"""bench.memory_e2e through the real app and the fake LLM over HTTP: a message the bot sends no
reply request for (here a command, answered without the model) does not stop the run; the
bench says what the person got, scores the question 0 and counts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.memory_e2e import Tally, Unanswered, ask, started, table, tally
from bench.prefix import STYLE_HINT
from bench.recall import Dialogue, Question, Turn
from bot.llm.tokens import make_counter
from tests.fakes.fake_llm import FakeLLM


async def test_a_message_without_a_reply_request_is_counted_not_fatal(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    app, transport = await started(tmp_path / "state", fake_llm.base_url, None)
    try:
        with pytest.raises(Unanswered, match=r"0 reply requests .*the person got \[.command: "):
            await ask(app, transport, fake_llm, "!status", 1)
        body = await ask(app, transport, fake_llm, "hello there, my boat is Osprey", 2)
        assert STYLE_HINT in body["messages"][0]["content"]
        into = Tally()
        question = Question("What is my boat called?", ("d1",), 4)
        dlg = Dialogue("s", "A", [Turn("d1", "A", "my boat is Osprey", 0.0)], [question])
        said: list[str] = []
        counter = make_counter()
        await tally(into, question, ask(app, transport, fake_llm, "!status", 3), dlg,
                    counter, said.append)  # fmt: skip
        asked = ask(app, transport, fake_llm, "What is my boat called?", 4)
        await tally(into, question, asked, dlg, counter, said.append)
    finally:
        await app.close()
    assert into.recall[4] == [0.0, 1.0] and len(into.unanswered) == 1
    assert "the person got" in said[0]
    assert "| 1 |" in table({"restart": into}, [4])  # the "no reply request" column
