"""A server that sends far more than an answer costs the bot no memory (issue 43): the real
openai client reads the body as it arrives, and the adapter stops reading at its limits and
hangs up (peak RSS: bench/llm_body.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.errors import LLMUnavailable
from bot.llm.body import MAX_JSON_BYTES
from bot.llm.openai_compat import MAX_ANSWER_CHARS, OpenAICompatLLM
from bot.llm.port import TRUNCATED_MARK, ChatMessage
from tests.conftest import make_config
from tests.fakes.flood_llm import FloodLLM

QUESTION = [ChatMessage(role="user", content="hello")]


async def _flood(tmp_path: Path, flood: FloodLLM) -> OpenAICompatLLM:
    await flood.start()
    return OpenAICompatLLM(config=make_config(tmp_path, flood.base_url).llm, env={})


async def test_a_flooding_stream_is_cut_and_the_rest_never_read(tmp_path: Path) -> None:
    flood = FloodLLM(total=100 * 1024 * 1024, stream=True)  # 100 MB of deltas, no end
    llm = await _flood(tmp_path, flood)
    try:
        answer = await llm.complete(QUESTION, max_tokens=100)
        assert answer.truncated and answer.text.endswith(TRUNCATED_MARK)
        assert MAX_ANSWER_CHARS - 10 < len(answer.text) <= MAX_ANSWER_CHARS
        assert answer.text.startswith("flood flood")
        await asyncio.wait_for(flood.answered.wait(), 60)
        assert flood.sent < flood.total // 10  # the client hung up: generation stops
    finally:
        await llm.close()
        await flood.stop()


async def test_a_huge_plain_answer_is_refused_unread(tmp_path: Path) -> None:
    flood = FloodLLM(total=100 * 1024 * 1024, stream=False)  # one 100 MB JSON completion
    llm = await _flood(tmp_path, flood)
    try:
        with pytest.raises(LLMUnavailable, match="over 1 MB, not streamed"):
            await llm.complete(QUESTION, max_tokens=100)
        await asyncio.wait_for(flood.answered.wait(), 60)
        assert flood.sent < flood.total // 10
    finally:
        await llm.close()
        await flood.stop()


async def test_a_plain_answer_under_the_limit_is_read(tmp_path: Path) -> None:
    flood = FloodLLM(total=MAX_JSON_BYTES // 2, stream=False)  # big, but a body it reads
    llm = await _flood(tmp_path, flood)
    try:
        answer = await llm.complete(QUESTION, max_tokens=100)
        assert answer.truncated and MAX_ANSWER_CHARS - 10 < len(answer.text) <= MAX_ANSWER_CHARS
    finally:
        await llm.close()
        await flood.stop()
