"""The structured-output mode a server refuses is learned once (issue 37, point 3): the
llama-cpp-python server answers HTTP 500 to ``json_schema``; the bot tries the mode on a
one-token request before it sends a real prompt in it, keeps what the server took per server
and model across restarts, and never sends the same fact prompt twice."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bot.llm.server_record import RECORD_FILE
from bot.memory.facts import PROMPT as FACTS_PROMPT
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.memory_script import MemoryScript


def _fact_prompts(fake: FakeLLM) -> list[dict[str, object]]:
    return [
        r for r in fake.chat_requests() if r["messages"][0]["content"].startswith(FACTS_PROMPT[:60])
    ]


async def _close_a_session(tmp_path: Path, fake: FakeLLM, person: str, text: str) -> None:
    script = MemoryScript()
    fake.reply_fn = script
    h = await start_harness(tmp_path, fake)
    try:
        conv = await h.store.conversation(h.transport_key(person))
        mid = await h.store.add_message(
            conv.id, role="user", author=person, text=text, tokens=8, status="answered",
            created_at=time.time() - 10 * 3600,
        )  # fmt: skip
        script.facts = json.dumps({"facts": [{"op": "add", "text": text, "source": [mid]}]})
        assert h.app.sessions is not None
        await h.app.sessions.tick()
        # one fact, the model's or the same one read plainly from the person's words
        [fact] = [f.text for f in await h.store.facts(conv.id)]
        assert text.split()[-1] in fact
    finally:
        await h.app.close()


async def test_a_refused_mode_costs_one_tiny_request_once_and_is_kept(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.refuse_json_schema = True
    await _close_a_session(tmp_path, fake_llm, "ana", "my door code is 4521")
    [prompt] = _fact_prompts(fake_llm)  # the fact prompt went once, in the mode that works
    assert prompt["response_format"]["type"] == "json_object"  # type: ignore[index]
    assert fake_llm.schema_refusals == 1
    [probe, _] = [r for r in fake_llm.requests if "response_format" in r][:2]
    assert probe["max_tokens"] == 1 and len(json.dumps(probe["messages"])) < 200
    kept = json.loads((tmp_path / "state" / RECORD_FILE).read_text())
    assert [e["structured"] for e in kept.values()] == ["json_object"]

    asked_before = len(fake_llm.requests)
    await _close_a_session(tmp_path, fake_llm, "bea", "my dog is called Biscuit")  # a restart
    assert fake_llm.schema_refusals == 1  # not asked in json_schema again
    later = fake_llm.requests[asked_before:]
    assert [r["response_format"]["type"] for r in later if "response_format" in r] == [
        "json_object"
    ]
