"""The server's limits are learned, overflow is never an outage, a cut stream is never whole.

Real parts: the openai client over loopback HTTP to the fake server, which refuses an
over-long prompt the way llama-cpp-python 0.3.36 does (streamed: an empty 200; not streamed:
HTTP 400 in OpenAI's words), cuts a stream close-delimited, and answers /props, /api/show,
/api/ps and /v1/models the way llama-server, Ollama and vLLM do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.answering import unavailable_notice
from bot.config import LLMConfig
from bot.errors import LLMUnavailable
from bot.fitting import TOO_LONG
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import CUT_MARK, ChatMessage, ContextTooLong
from bot.llm.server_limits import (
    RELEARN_EVERY,
    LearnedLimits,
    ServerLimits,
    budget,
    ctx_from_error,
    learn,
    prompt_from_error,
)
from bot.ops.doctor import Level, check_limits
from bot.ops.probe import warn_if_unreachable
from bot.ops.status import render
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

HI = [ChatMessage("user", "hi")]
UNLIMITED = "bot:\n  rate_limit: {messages: 10000, per_seconds: 1}\n  queue_limit: 100\n"
NO_SUMMARIES = "memory:\n  summary: {enabled: false}\n  extract_facts: false\n"


async def _no_sleep(_: float) -> None:
    return None


def _client(url: str, **kw: object) -> OpenAICompatLLM:
    cfg = LLMConfig.model_validate(
        {"base_url": url, "model": "fake", "api_key_env": None, "retries": 1, **kw}
    )
    return OpenAICompatLLM(config=cfg, env={}, sleep=_no_sleep)


# --- a stream is complete only when the server says so ---------------------------------------
async def test_a_close_delimited_cut_stream_is_retried_and_the_retry_counts(
    fake_llm: FakeLLM,
) -> None:
    fake_llm.reply = "one two three four five six"
    fake_llm.script = [("cut", 3)]
    llm = _client(fake_llm.base_url)
    out = await llm.complete(HI, max_tokens=20)
    assert out.text == "one two three four five six" and not out.cut
    assert len(fake_llm.chat_requests()) == 2
    await llm.close()


async def test_a_stream_cut_on_every_attempt_is_marked_cut_never_whole(fake_llm: FakeLLM) -> None:
    fake_llm.reply = "one two three four five six"
    fake_llm.script = [("cut", 2), ("cut", 4)]
    llm = _client(fake_llm.base_url)
    out = await llm.complete(HI, max_tokens=20)
    assert out.cut and out.truncated
    assert out.text == "one two three four" + CUT_MARK  # the longest cut, marked
    await llm.close()


async def test_a_cut_answer_reaches_the_person_and_the_store_marked(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, extra=NO_SUMMARIES)
    try:
        fake_llm.reply = "the first half of a long answer and then the second half"
        fake_llm.script = [("cut", 6)]  # retries: 0 in the harness
        await h.say("tell me")
        assert h.transport.texts()[-1] == "the first half of a long" + CUT_MARK
        conv = await h.app.store.conversation(h.transport_key("alice"))
        stored = await h.app.store.recent_messages(conv, limit=1)
        assert stored[0].role == "assistant" and stored[0].text.endswith(CUT_MARK)
    finally:
        await h.app.close()


# --- overflow in every form is ContextTooLong -------------------------------------------------
async def test_an_empty_streamed_200_for_a_long_prompt_is_context_too_long(
    fake_llm: FakeLLM,
) -> None:
    fake_llm.n_ctx = 50
    llm = _client(fake_llm.base_url)
    with pytest.raises(ContextTooLong) as err:
        await llm.complete([ChatMessage("user", "word " * 100)], max_tokens=10)
    assert "maximum context length is 50 tokens" in err.value.server_message
    # streamed (empty 200), then asked once without streaming, which named the context
    streamed = [r.get("stream") for r in fake_llm.chat_requests()]
    assert streamed == [True, False] and fake_llm.chat_requests()[1]["max_tokens"] == 1
    await llm.close()


async def test_an_empty_stream_for_a_prompt_that_fits_is_a_failed_attempt(
    fake_llm: FakeLLM,
) -> None:
    fake_llm.script = ["empty_stream"]
    fake_llm.reply = "fine"
    llm = _client(fake_llm.base_url)
    out = await llm.complete(HI, max_tokens=10)
    assert out.text == "fine"  # the retry answered; nothing was called too long
    await llm.close()


async def test_an_error_event_inside_the_stream(fake_llm: FakeLLM) -> None:
    llm = _client(fake_llm.base_url, retries=0)
    fake_llm.script = [("stream_error", "request (900 tokens) exceeds the available context "
                                        "size (512 tokens), try increasing it")]  # fmt: skip
    with pytest.raises(ContextTooLong) as err:
        await llm.complete(HI, max_tokens=10)
    assert ctx_from_error(err.value.server_message) == 512
    fake_llm.script = [("stream_error", "out of memory")]
    with pytest.raises(LLMUnavailable) as other:
        await llm.complete(HI, max_tokens=10)
    assert not isinstance(other.value, ContextTooLong)
    await llm.close()


async def test_a_prompt_the_server_reports_truncated_is_context_too_long(
    fake_llm: FakeLLM,
) -> None:
    fake_llm.script = [("truncated", "an answer to half a prompt")]
    llm = _client(fake_llm.base_url, retries=0)
    with pytest.raises(ContextTooLong):
        await llm.complete(HI, max_tokens=10)
    await llm.close()


@pytest.mark.parametrize(
    ("said", "n_ctx", "prompt"),
    [
        (
            "This model's maximum context length is 512 tokens. However, you requested 736 "
            "tokens (731 in the messages, 5 in the completion).",
            512,
            731,
        ),
        ("Requested tokens (925) exceed context window of 512", 512, 925),
        ("request (900 tokens) exceeds the available context size (2048 tokens)", 2048, 900),
        ("context_length_exceeded", None, None),
    ],
)
def test_the_size_a_server_names_in_its_overflow_error(
    said: str, n_ctx: int | None, prompt: int | None
) -> None:
    assert ctx_from_error(said) == n_ctx and prompt_from_error(said) == prompt


# --- the person is never locked out ------------------------------------------------------------
async def test_a_small_server_context_locks_nobody_out(tmp_path: Path, fake_llm: FakeLLM) -> None:
    """The issue's field case: a 512-token server, a 2,048-token budget, a server that counts
    8% more tokens than cl100k and reports no size (llama-cpp-python): every message is
    answered, the size is learned from the first refusal, and later prompts fit."""
    fake_llm.n_ctx = 512
    fake_llm.token_ratio = 1.08
    h = await start_harness(
        tmp_path, fake_llm, extra=UNLIMITED + NO_SUMMARIES,
        transport=FakeTransport(context_tokens=2048, max_tokens=400),
    )  # fmt: skip
    try:
        for i in range(16):
            fake_llm.reply = f"answer {i}"
            await h.say(f"question {i}: " + "tell me more about radios and antennas " * 6)
            assert h.transport.texts()[-1] == f"answer {i}", h.transport.texts()[-1]
        assert unavailable_notice(fake_llm.base_url) not in h.transport.texts()
        # one overflow, to learn the size: the empty stream and the one question without
        # streaming that made the server name its size; never again
        assert fake_llm.refused == 2
        assert h.app.server_limits is not None and h.app.server_limits.current.n_ctx == 512
        last = fake_llm.chat_requests()[-1]
        assert fake_llm.count_prompt(last) + last["max_tokens"] <= 512
    finally:
        await h.app.close()


async def test_a_message_longer_than_the_whole_context_is_answered_cut(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.n_ctx = 512
    h = await start_harness(tmp_path, fake_llm, extra=UNLIMITED + NO_SUMMARIES)
    try:
        fake_llm.reply = "read it"
        await h.say("a very long paste " * 400)
        assert h.transport.texts()[-1].startswith("read it")  # with the "trimmed" note
        fake_llm.reply = "short one"
        await h.say("and a short one")
        assert h.transport.texts()[-1] == "short one"
    finally:
        await h.app.close()


async def test_a_server_that_refuses_everything_gets_told_not_unavailable(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.n_ctx = 100  # smaller than the system prompt and a message: no prompt fits
    h = await start_harness(tmp_path, fake_llm, extra=UNLIMITED + NO_SUMMARIES)
    try:
        await h.say("hello " * 80)
        assert h.transport.texts()[-1] == TOO_LONG.format(prefix="!")
        gate = h.app.gate
        assert not gate._down  # not an outage: the next person is not failed at once
        # the size is now known (100): the next turn's budget cannot hold the system prompt
        # and a message, and the person is told so again, not "something went wrong"
        await h.say("and this?")
        assert h.transport.texts()[-1] == TOO_LONG.format(prefix="!")
    finally:
        await h.app.close()


async def test_a_server_restarted_with_a_smaller_context_is_relearned(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}
    h = await start_harness(
        tmp_path, fake_llm, extra=UNLIMITED + NO_SUMMARIES,
        transport=FakeTransport(context_tokens=2048, max_tokens=100),
    )  # fmt: skip
    try:
        limits = h.app.server_limits
        assert limits is not None and limits.current.n_ctx == 4096
        for i in range(8):
            await h.say(f"message {i} " + "about the weather on the hill " * 10)
        assert fake_llm.prompt_tokens[-1] > 600  # would not fit in 512
        fake_llm.props = {"default_generation_settings": {"n_ctx": 512}, "total_slots": 1}
        fake_llm.n_ctx = 512  # restarted while the bot runs; no connection was lost
        fake_llm.reply = "still here"
        await h.say("are you there?")
        assert h.transport.texts()[-1] == "still here"
        assert limits.current.n_ctx == 512 and limits.current.source == "/props"
    finally:
        await h.app.close()


# --- limits learned from each kind of server --------------------------------------------------
async def test_learned_from_llama_server_props(fake_llm: FakeLLM) -> None:
    fake_llm.props = {"default_generation_settings": {"n_ctx": 8192}, "total_slots": 2}
    got = await learn(base_url=fake_llm.base_url, model="fake")
    assert (got.n_ctx, got.slots, got.server, got.source) == (8192, 2, "llama.cpp", "/props")


async def test_learned_from_ollama_show_and_ps(fake_llm: FakeLLM) -> None:
    fake_llm.ollama_show = {
        "parameters": "stop <|im_end|>\nnum_ctx 4096",
        "model_info": {"llama.context_length": 131072},
    }
    fake_llm.ollama_ps = {"models": []}
    got = await learn(base_url=fake_llm.base_url, model="fake")
    assert got.n_ctx == 4096 and got.server == "Ollama" and got.loaded is False
    assert "131072" in got.source
    fake_llm.ollama_ps = {"models": [{"name": "fake", "model": "fake", "context_length": 8192}]}
    got = await learn(base_url=fake_llm.base_url, model="fake")
    assert got.n_ctx == 8192 and got.loaded is True  # what the loaded model really holds
    fake_llm.ollama_show = {"parameters": "", "model_info": {"qwen2.context_length": 32768}}
    fake_llm.ollama_ps = {"models": []}
    got = await learn(base_url=fake_llm.base_url, model="fake")
    assert got.n_ctx == 2048 and "default" in got.source  # said so, not hidden


async def test_learned_from_vllm_models(fake_llm: FakeLLM) -> None:
    fake_llm.max_model_len = 16384
    got = await learn(base_url=fake_llm.base_url, model="fake")
    assert (got.n_ctx, got.server) == (16384, "vLLM")


async def test_a_server_that_reports_nothing_leaves_the_config(fake_llm: FakeLLM) -> None:
    got = await learn(base_url=fake_llm.base_url, model="fake")
    assert got.n_ctx is None and got.learned_at is not None
    assert budget(got, context_tokens=2048, max_tokens=400) == (2048, 400)
    assert "context_tokens from the config stands" in got.describe()
    check = await check_limits(LLMConfig(base_url=fake_llm.base_url, model="fake"),
                               {"console": (2048, 400)})  # fmt: skip
    assert check.level is Level.OK and "reports no context size" in check.detail


async def test_nothing_answering_is_not_learning() -> None:
    got = await learn(base_url="http://127.0.0.1:9/v1", model="m", timeout=0.5)
    assert got.n_ctx is None and got.learned_at is None and "did not answer" in got.describe()


@pytest.mark.parametrize(
    ("n_ctx", "config", "used"),
    [
        (None, (2048, 400), (2048, 400)),
        (8192, (2048, 400), (2048, 400)),  # never more than the config
        (4096, (4096, 800), (2966, 800)),  # Discord's defaults on a 4k server
        (2048, (1536, 120), (1536, 120)),  # the mesh's defaults on Ollama's default
        (512, (2048, 400), (345, 128)),  # a small context: the answer gets a quarter
    ],
)
def test_budget(n_ctx: int | None, config: tuple[int, int], used: tuple[int, int]) -> None:
    got = budget(ServerLimits(n_ctx=n_ctx), context_tokens=config[0], max_tokens=config[1])
    assert got == used


async def test_doctor_and_status_show_what_was_learned(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.props = {"default_generation_settings": {"n_ctx": 512}, "total_slots": 1}
    check = await check_limits(LLMConfig(base_url=fake_llm.base_url, model="fake"),
                               {"console": (2048, 400)})  # fmt: skip
    assert check.level is Level.WARN and "n_ctx 512 (/props)" in check.detail
    assert "console 345+128 (config 2048+400)" in check.detail and "--n_ctx" in check.fix
    h = await start_harness(tmp_path, fake_llm)
    try:
        assert h.app.monitor is not None
        lines, _ok = render(await h.app.monitor.collect())
        assert any(line.startswith("  LLM limits: n_ctx 512 (/props), 1 slot(s)") for line in lines)
    finally:
        await h.app.close()


async def test_a_model_unloaded_by_keep_alive_is_a_load_not_an_outage(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.ollama_show = {"parameters": "num_ctx 4096", "model_info": {}}
    fake_llm.ollama_ps = {"models": [{"name": "fake", "context_length": 4096}]}
    h = await start_harness(tmp_path, fake_llm, extra=NO_SUMMARIES)
    try:
        await h.say("hi")
        fake_llm.ollama_ps = {"models": []}  # keep_alive ran out between turns
        fake_llm.script = [("sleep", 0.2)]  # the load
        fake_llm.reply = "after the load"
        await h.say("still there?")
        assert h.transport.texts()[-1] == "after the load"
        limits = h.app.server_limits
        assert limits is not None and limits.cold_loads == 1
        assert h.app.monitor is not None
        status = await h.app.monitor.collect()
        assert (
            "waited for a model load" in status.llm_limits and "not an outage" in status.llm_limits
        )
        assert status.healthy and not h.app.gate._down
    finally:
        await h.app.close()


def test_a_learned_limits_holder_relearns_after_the_connection_was_lost() -> None:
    calls: list[str] = []

    def fetch(url: str, data: bytes | None, timeout: float) -> object:
        calls.append(url)
        return {"default_generation_settings": {"n_ctx": 1024}} if url.endswith("/props") else None

    import asyncio

    now = [0.0]

    async def run() -> None:
        limits = LearnedLimits(
            base_url="http://h:1/v1", model="m", fetch=fetch, clock=lambda: now[0]
        )
        await limits.ensure()
        await limits.ensure()  # fresh: no second look
        assert sum(u.endswith("/props") for u in calls) == 1
        limits.mark_stale()  # the connection was lost
        await limits.ensure()  # at once: no (a host that does not answer costs a timeout)
        assert sum(u.endswith("/props") for u in calls) == 1
        now[0] += RELEARN_EVERY
        await limits.ensure()
        assert sum(u.endswith("/props") for u in calls) == 2 and limits.current.n_ctx == 1024
        await limits.ensure()  # fresh again
        assert sum(u.endswith("/props") for u in calls) == 2

    asyncio.run(run())


# --- the start probe and the fixes it names ---------------------------------------------------
async def test_a_model_that_is_not_pulled_is_named_at_start(fake_llm: FakeLLM) -> None:
    said: list[str] = []
    await warn_if_unreachable(fake_llm.base_url, said.append, model="llama3.2:3b")
    assert len(said) == 1 and "ollama pull llama3.2:3b" in said[0] and "fake" in said[0]
    said.clear()
    await warn_if_unreachable(fake_llm.base_url, said.append, model="fake")
    assert said == []


async def test_a_404_names_v1_or_the_model(fake_llm: FakeLLM) -> None:
    root = fake_llm.base_url.removesuffix("/v1")
    llm = _client(root, retries=0)
    with pytest.raises(LLMUnavailable) as err:
        await llm.complete(HI, max_tokens=5)
    assert f"base_url should end in /v1: set llm.base_url: {root}/v1" in str(err.value)
    await llm.close()
    fake_llm.script = [("status", 404, {"error": {"message": 'model "fake" not found, try '
                                                              "pulling it first"}})]  # fmt: skip
    llm = _client(fake_llm.base_url, retries=0)
    with pytest.raises(LLMUnavailable) as err:
        await llm.complete(HI, max_tokens=5)
    assert "ollama pull fake" in str(err.value) and "/v1" not in str(err.value).split("Fix:")[1]
    await llm.close()


# --- background work fits the learned size too ------------------------------------------------
async def test_chapters_merges_facts_and_sessions_fit_a_small_server(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """A 512-token server whose size was learned: a standalone chapter, a merge, fact
    extraction and session and long-term summaries each send what fits (fewer messages per
    call, each covering exactly what it read), never a prompt the server refuses. (They
    were bounded by fixed sizes: a 749-token chapter prompt was refused twice on such a
    server.)"""
    from bot.config import SummaryConfig
    from bot.domain import ConversationKey
    from bot.llm.tokens import make_counter
    from bot.memory.facts import FactExtractor
    from bot.memory.sessions import SessionKeeper
    from bot.memory.store import SqliteStore
    from bot.memory.summary import Summarizer

    fake_llm.n_ctx = 512
    fake_llm.reply = "Alice talked about radios."
    limits = LearnedLimits(base_url=fake_llm.base_url, model="fake")
    limits.current = ServerLimits(n_ctx=512, source="test")  # as learned
    store = await SqliteStore.open(tmp_path / "m.db")
    counter = make_counter()
    llm = _client(fake_llm.base_url)
    try:
        conv = await store.conversation(ConversationKey("console", "alice"))
        line = "my antenna on the north mast is a 5/8 wave whip at 12 metres " * 3
        ids = [
            await store.add_message(conv.id, role="user" if i % 2 == 0 else "assistant",
                                    author="alice" if i % 2 == 0 else "bot", text=f"{i} {line}",
                                    tokens=counter.count(line) + 2, status="answered")
            for i in range(40)
        ]  # fmt: skip
        extractor = FactExtractor(store=store, llm=llm, counter=counter, max_facts=20,
                                  room=limits.room)  # fmt: skip
        summ = Summarizer(store=store, llm=llm, counter=counter, room=limits.room,
                          config=SummaryConfig(min_evicted=6))  # fmt: skip
        for _ in range(4):  # a summarizer that fell behind catches up chapter by chapter
            await summ.refresh(conv, window_start_id=ids[-2])
        assert len(await store.summaries(conv)) >= 3
        chapters = await store.summaries(conv)
        assert chapters and chapters[0].first_message_id == ids[0]
        assert chapters[-1].last_message_id < ids[-2]  # less per chapter than 1,500 tokens
        chapters = await store.summaries(conv)
        for n, c in enumerate(chapters):  # long chapters: all of them do not fit one merge
            text = f"chapter {n}: " + line * 2
            await store.save_summary(conv.id, text=text, tokens=counter.count(text),
                                     first_message_id=c.first_message_id,
                                     last_message_id=c.last_message_id)  # fmt: skip
        assert await summ.merge(conv)
        merged = await store.summaries(conv)
        assert 1 < len(chapters) - len(merged) + 1 < len(chapters)  # some chapters merged
        fake_llm.reply = '{"facts": []}'
        await extractor.extract(conv.id, [m for m in await store.messages_between(
            conv.id, after_id=0, up_to_id=ids[-1])])  # fmt: skip
        assert await store.facts_through(conv.id) == ids[-1]  # every message read, in chunks
        fake_llm.reply = "Radios\nAlice talked about her antenna."
        keeper = SessionKeeper(store=store, llm=llm, counter=counter, gap=60.0,
                               extractor=None, room=limits.room)  # fmt: skip
        for n in range(3):
            first, last = ids[n * 12], ids[n * 12 + 11]
            sid = await store.add_session(
                conv.id,
                first_message_id=first,
                last_message_id=last,
                started_at=1e9,
                ended_at=1e9 + 60,
                messages=12,
            )
            assert sid is not None
        for session in await store.sessions(conv.id):
            assert await keeper._summarize(session)
        assert (await store.longterm_summary(conv.id)) is not None
        asked = fake_llm.chat_requests()
        assert len(asked) >= 8
        assert fake_llm.refused == 0
        assert all(fake_llm.count_prompt(r) + r["max_tokens"] <= 512 for r in asked)
    finally:
        await llm.close()
        await store.close()


async def test_status_shows_the_prompt_speed_and_the_recall_it_allows(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """A slow server (each answer starts after 0.2 s): the status names the prompt speed the
    bot measured and the recall room it gives (``memory.retrieval.recall_seconds``)."""
    h = await start_harness(tmp_path, fake_llm, extra=NO_SUMMARIES)
    try:
        assert h.app.monitor is not None
        assert "prompt tokens/s" not in (await h.app.monitor.collect()).llm_limits
        for text in ("hi", "tell me about antennas and cables " * 8, "and solar?"):
            fake_llm.script = [("sleep", 0.2)]
            await h.say(text)
        rate = h.app.gate.prompt_rate
        assert rate is not None
        limits = (await h.app.monitor.collect()).llm_limits
        room = h.app.gate.tokens_in(5.0)  # the default recall_seconds
        assert f"reads {rate:.0f} prompt tokens/s (a reply's recall is held to {room} tokens)" in (
            limits
        )
    finally:
        await h.app.close()
