"""The OpenAI-compatible adapter against a fake server over real loopback HTTP."""

from __future__ import annotations

import itertools

import pytest

from bot.config import LLMConfig
from bot.errors import LLMUnavailable
from bot.llm.openai_compat import OpenAICompatLLM, strip_thinking
from bot.llm.port import ChatMessage
from tests.fakes.fake_llm import FakeLLM

HI = [ChatMessage("user", "hi")]


async def _no_sleep(_: float) -> None:
    return None


def _client(url: str, **kw: object) -> OpenAICompatLLM:
    cfg = LLMConfig.model_validate(
        {"base_url": url, "model": "m", "retries": 1, "read_timeout": 1, **kw}
    )
    return OpenAICompatLLM(config=cfg, env={"OPENAI_API_KEY": "sk-test"}, sleep=_no_sleep)


async def test_answer_key_and_max_tokens(fake_llm: FakeLLM) -> None:
    fake_llm.reply = "hello"
    llm = _client(fake_llm.base_url)
    out = await llm.complete(HI, max_tokens=77)
    assert out.text == "hello" and out.model == "m"
    req = fake_llm.chat_requests()[0]
    assert req["max_tokens"] == 77 and req["messages"] == [{"role": "user", "content": "hi"}]
    await llm.close()


async def test_retries_are_bounded_then_unavailable(fake_llm: FakeLLM) -> None:
    fake_llm.script = [("status", 503, {"error": "loading"})] * 10
    llm = _client(fake_llm.base_url, retries=2)
    with pytest.raises(LLMUnavailable) as err:
        await llm.complete(HI, max_tokens=10)
    assert len(fake_llm.chat_requests()) == 3
    assert "HTTP 503" in str(err.value) and "Fix:" in str(err.value)
    await llm.close()


async def test_hanging_server_times_out(fake_llm: FakeLLM) -> None:
    fake_llm.script = [("sleep", 3), ("sleep", 3)]
    llm = _client(fake_llm.base_url, retries=0, read_timeout=0.3)
    with pytest.raises(LLMUnavailable, match="timed out"):
        await llm.complete(HI, max_tokens=10)
    await llm.close()


async def test_fallback_endpoint_answers_when_primary_fails(fake_llm: FakeLLM) -> None:
    backup = FakeLLM()
    await backup.start()
    backup.reply = "from backup"
    try:
        fake_llm.script = [("status", 404, {"error": {"message": "model not found"}})]
        llm = _client(
            fake_llm.base_url,
            fallbacks=[{"base_url": backup.base_url, "model": "small"}],
        )
        out = await llm.complete(HI, max_tokens=10)
        assert out.text == "from backup" and out.model == "small"
        assert len(fake_llm.chat_requests()) == 1  # 404 is not retried
        await llm.close()
    finally:
        await backup.stop()


async def test_refused_connection_is_unavailable() -> None:
    llm = _client("http://127.0.0.1:9/v1", retries=0)
    with pytest.raises(LLMUnavailable, match="connection failed"):
        await llm.complete(HI, max_tokens=10)
    await llm.close()


async def test_empty_answer_is_a_failure(fake_llm: FakeLLM) -> None:
    fake_llm.script = [("reply", "<think>hmm</think>   "), ("reply", "")]
    llm = _client(fake_llm.base_url)
    with pytest.raises(LLMUnavailable, match="empty answer"):
        await llm.complete(HI, max_tokens=10)
    await llm.close()


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("<think>plan</think>Answer", "Answer"),
        ("reasoning without open tag</think>\nAnswer", "Answer"),
        ("<think>still thinking when max_tokens hit", ""),
        # A tag the answer talks about is not reasoning (issue 9): it stays.
        ("Write <think> before your plan.", "Write <think> before your plan."),
        ("Answer: the <think> tag opens reasoning", "Answer: the <think> tag opens reasoning"),
        ("<THINK>a</THINK>x<think>b</think>y", "xy"),
        ("no thinking", "no thinking"),
    ],
)
def test_strip_thinking(raw: str, clean: str) -> None:
    assert strip_thinking(raw) == clean


async def test_backoff_grows_exponentially_with_jitter(fake_llm: FakeLLM) -> None:
    fake_llm.script = [("status", 500, {"error": "busy"})] * 4
    delays: list[float] = []

    async def record(seconds: float) -> None:
        delays.append(seconds)

    cfg = LLMConfig.model_validate(
        {"base_url": fake_llm.base_url, "model": "m", "retries": 3, "retry_backoff": 2.0}
    )
    llm = OpenAICompatLLM(config=cfg, env={}, sleep=record)
    with pytest.raises(LLMUnavailable):
        await llm.complete(HI, max_tokens=10)
    await llm.close()
    assert len(fake_llm.chat_requests()) == 4 and len(delays) == 3  # no sleep before the first
    for attempt, delay in enumerate(delays):
        base = 2.0 * 2**attempt  # 2, 4, 8 s, each cut by a random factor in [0.5, 1]
        assert base / 2 <= delay <= base, (attempt, delay)


async def test_streamed_answer_grows_and_a_retry_starts_over(fake_llm: FakeLLM) -> None:
    fake_llm.reply = "<think>hmm</think>one two three"
    fake_llm.script = [("status", 503, {"error": "loading"}), "stream"]
    seen: list[str] = []

    async def on_text(text: str) -> None:
        seen.append(text)

    llm = _client(fake_llm.base_url, retries=1)
    out = await llm.complete(HI, max_tokens=10, on_text=on_text)
    assert out.text == "one two three"
    assert fake_llm.chat_requests()[-1]["stream"] is True
    # Reasoning is never shown; each attempt starts from nothing; the text only grows after.
    assert seen[:2] == ["", ""]
    assert seen[-1] == "one two three"
    grown = seen[2:]
    assert all(b.startswith(a) for a, b in itertools.pairwise(grown))
    assert not any("think" in s or "hmm" in s for s in seen)
    await llm.close()


def test_merge_system_keeps_the_images_of_the_first_user_message() -> None:
    from bot.llm.port import merge_system

    msgs = [ChatMessage("system", "be brief"), ChatMessage("user", "what is this?", ("data:x",))]
    [merged] = merge_system(msgs)
    assert (merged.content, merged.images) == ("be brief\n\nwhat is this?", ("data:x",))
