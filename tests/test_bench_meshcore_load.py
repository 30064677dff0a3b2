"""bench.meshcore_load runs and measures what it says (small sizes)."""

from __future__ import annotations

from bench.meshcore_load import ANSWER, scenario, table
from tests.fakes.fake_llm import FakeLLM


async def test_a_small_burst_is_measured() -> None:
    llm = FakeLLM()
    llm.reply = ANSWER
    await llm.start()
    try:
        quiet = await scenario(3, delayed=False, others=0.0, llm=llm)
        busy = await scenario(3, delayed=False, others=15.0, llm=llm)
    finally:
        await llm.stop()
    assert quiet.undelivered == 0 and quiet.packets_per_answer == 1.0 and quiet.first == 0.0
    assert busy.last > quiet.last  # the busy channel slows the bot down
    assert "| 3 | instant | busy (15%) |" in table([quiet, busy])
