"""Facts a tiny model can write: the JSON schema travels as the server's structured output
(OpenAI json_schema; llama-cpp-python's json_object + schema after it refuses json_schema;
plain when it refuses both), junk facts are dropped, an answer with no JSON leaves its messages
unread and is retried once, and nothing forgotten meanwhile is sent."""

from __future__ import annotations

import json
import logging

import pytest

from bot.config import LLMConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import ChatMessage
from bot.llm.tokens import make_counter
from bot.memory.facts import SCHEMA, FactExtractor, grounded
from bot.memory.store import SqliteStore, StoredMessage
from tests.fakes.fake_llm import FakeLLM

KEY = ConversationKey("console", "ana")
LLAMA_CPP_PYTHON_REFUSAL = {  # what llama-cpp-python 0.3.36 answers to json_schema (HTTP 500)
    "error": {
        "message": "1 validation error: {'type': 'literal_error', 'loc': ('body', "
        "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\"}",
        "type": "internal_server_error",
    }
}


def _llm(fake: FakeLLM) -> OpenAICompatLLM:
    cfg = LLMConfig.model_validate({"base_url": fake.base_url, "model": "m", "retries": 1,
                                    "retry_backoff": 0.01})  # fmt: skip
    return OpenAICompatLLM(config=cfg, env={})


async def _chat(store: SqliteStore, texts: list[str]) -> list[StoredMessage]:
    conv = await store.conversation(KEY)
    for i, text in enumerate(texts):
        await store.add_message(conv.id, role="user" if i % 2 == 0 else "assistant",
                                author="ana" if i % 2 == 0 else "bot", text=text, tokens=3,
                                status="answered")  # fmt: skip
    return await store.all_messages(conv.id)


async def test_the_schema_goes_as_json_schema_then_json_object_then_plain(
    fake_llm: FakeLLM,
) -> None:
    llm = _llm(fake_llm)
    ask = [ChatMessage("user", "facts?")]
    try:
        fake_llm.script = [("status", 500, LLAMA_CPP_PYTHON_REFUSAL), "ok"]
        assert (await llm.complete(ask, max_tokens=9, schema=SCHEMA)).text == "Hello from fake"
        first, second = fake_llm.chat_requests()
        assert first["response_format"]["type"] == "json_schema"
        assert first["response_format"]["json_schema"]["schema"] == SCHEMA
        assert second["response_format"] == {"type": "json_object", "schema": SCHEMA}
        # Remembered for this endpoint: the next call goes straight to json_object.
        await llm.complete(ask, max_tokens=9, schema=SCHEMA)
        assert fake_llm.chat_requests()[-1]["response_format"]["type"] == "json_object"
        # A server that takes neither gets a plain request, and the call still succeeds.
        fake_llm.script = [("status", 400, {"error": {"message": "response_format unsupported"}})]
        await llm.complete(ask, max_tokens=9, schema=SCHEMA)
        assert "response_format" not in fake_llm.chat_requests()[-1]
        # Without a schema nothing is added; a real 500 is still a failed attempt, retried.
        fake_llm.script = [("status", 500, {"error": {"message": "out of memory"}}), "ok"]
        await llm.complete(ask, max_tokens=9)
        assert all("response_format" not in r for r in fake_llm.chat_requests()[-2:])
    finally:
        await llm.close()


def test_junk_facts_are_not_grounded() -> None:
    msgs = [
        StoredMessage(1, 1, "user", "ana", "my door code is 4521 and I live in Porto", 0.0, 9,
                      None, None, "x"),
        StoredMessage(2, 1, "assistant", "bot", "Nice! Porto is lovely.", 0.0, 5, None, None, "x"),
    ]  # fmt: skip
    assert grounded("1. ana: my door code is 4521", msgs) == "my door code is 4521"
    assert grounded("[1] ana: I live in Porto", msgs) == "I live in Porto"
    assert grounded("1234567890", msgs) is None  # not said
    assert grounded("Nice! Porto is lovely.", msgs) is None  # the assistant's line
    assert grounded("Write each fact as a short third-person sentence.", msgs) is None
    assert grounded("messages", msgs) is None


async def test_an_answer_without_json_leaves_the_messages_unread_and_is_retried_once(
    store: SqliteStore, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm = _llm(fake_llm)
    extractor = FactExtractor(store=store, llm=llm, counter=make_counter(), max_facts=20)
    msgs = await _chat(store, ["my door code is 4521", "Noted."])
    conv = await store.conversation(KEY)
    try:
        fake_llm.reply = "The person has a door code."  # prose, even with a schema
        await extractor.extract(conv.id, msgs)
        assert await store.facts_through(conv.id) == 0  # unread: read again later
        more = await _chat(store, ["my wife is called Maria", "Hello Maria!"])
        new = [m for m in more if m.id not in {x.id for x in msgs}]
        fake_llm.reply = json.dumps({"facts": [{"op": "add", "text": "ana: my wife is called "
                                                "Maria", "source": [new[0].id]}]})  # fmt: skip
        await extractor.extract(conv.id, new)  # the earlier messages are read first, with these
        prompt = fake_llm.chat_requests()[-1]["messages"][1]["content"]
        assert "door code is 4521" in prompt and "wife is called Maria" in prompt
        # the person's plain statements are kept whatever the model answers (issue 37)
        kept = [f.text for f in await store.facts(conv.id)]
        assert kept == ["Their door code is 4521.", "my wife is called Maria"]
        assert await store.facts_through(conv.id) == new[-1].id

        # Twice no JSON for the same messages: skipped, with a warning saying why.
        last = await _chat(store, ["I fly to Lisbon on 12 March", "Have a good trip"])
        later = [m for m in last if m.id > new[-1].id]
        fake_llm.reply = "Sorry, I cannot."
        with caplog.at_level(logging.WARNING, logger="bot.memory.facts"):
            await extractor.extract(conv.id, later)
            assert await store.facts_through(conv.id) == new[-1].id
            await extractor.extract(conv.id, later)
        assert await store.facts_through(conv.id) == later[-1].id
        assert extractor.skipped == 1
        assert any("without usable JSON" in r.getMessage() for r in caplog.records)
        assert not any("Lisbon" in r.getMessage() for r in caplog.records)  # no message text
    finally:
        await llm.close()


async def test_nothing_forgotten_meanwhile_is_sent(store: SqliteStore, fake_llm: FakeLLM) -> None:
    """The messages read for a session close, then forgotten (another gateway) before the
    fact call: no request holds them, and the extraction ends without an error."""
    llm = _llm(fake_llm)
    extractor = FactExtractor(store=store, llm=llm, counter=make_counter(), max_facts=20)
    msgs = await _chat(store, ["my door code is 4521", "Noted."])
    conv = await store.conversation(KEY)
    try:
        await store.forget_person(KEY.transport, KEY.person)
        applied = await extractor.extract(conv.id, msgs)
        assert (applied.added, applied.ignored) == (0, 0)
        assert fake_llm.chat_requests() == []
    finally:
        await llm.close()
