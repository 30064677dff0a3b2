"""Known failure in other bots: "LLM unavailable" is saved as the assistant's turn and later fed
back to the model as if it had said it."""

from __future__ import annotations

from tests.conftest import Harness


async def test_apology_absent_from_log_and_later_prompts(harness: Harness) -> None:
    harness.llm.script = [("status", 503, {"error": "loading"})]
    await harness.say("first question")
    rows = await harness.store._all("SELECT role, status FROM messages ORDER BY id")
    assert [tuple(r) for r in rows] == [("user", "failed")]
    harness.llm.reply = "fine answer"
    await harness.say("second question")
    prompt = harness.llm.chat_requests()[-1]["messages"]
    assert all("unavailable" not in m["content"] for m in prompt)
    assert [m["role"] for m in prompt] == ["system", "user"]  # both questions, one user turn
