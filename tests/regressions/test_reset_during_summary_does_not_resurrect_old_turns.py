"""Known failure in other bots: a reset leaves a summary in flight, which is then written back
and brings the "forgotten" conversation into context again."""

from __future__ import annotations

import asyncio

from bot.config import LLMConfig, SummaryConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.tokens import make_counter
from bot.memory.store import SqliteStore
from bot.memory.summary import Summarizer
from tests.fakes.fake_llm import FakeLLM


async def test_summary_finishing_after_reset_is_discarded(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    conv = await store.conversation(ConversationKey("console", "alice"))
    ids = [
        await store.add_message(conv.id, role="user", author="alice", text=f"secret plan {i}",
                                tokens=3, status="answered")
        for i in range(10)
    ]  # fmt: skip
    llm = OpenAICompatLLM(
        config=LLMConfig.model_validate({"base_url": fake_llm.base_url, "retries": 0}), env={}
    )
    fake_llm.script = [("sleep", 0.3), "ok"]
    fake_llm.reply = "They discussed the secret plan."
    summ = Summarizer(store=store, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=4))  # fmt: skip
    assert summ.maybe_schedule(conv, window_start_id=ids[-1])
    while fake_llm.in_flight == 0:
        await asyncio.sleep(0.01)
    await store.reset(conv.id)  # the person resets while the summary is being written
    while summ.running:
        await asyncio.sleep(0.01)
    fresh = await store.conversation(conv.key)
    assert await store.latest_summary(fresh) is None
    assert (await store.stats())["summaries"] == 0
    await llm.close()
