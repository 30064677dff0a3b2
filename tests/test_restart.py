"""Restarting the bot (a new app object on the same database file) continues each conversation:
the window, pinned facts, a reset and a forget all survive; nothing comes back that should not.

test_cli.py::test_scripted_chat_remembers_across_restarts shows the same with new processes.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM


def _prompt(llm: FakeLLM) -> str:
    return "\n".join(m["content"] for m in llm.chat_requests()[-1]["messages"])


async def _restart(old: Harness, tmp_path: Path, llm: FakeLLM) -> Harness:
    await old.app.close()
    new = await start_harness(tmp_path, llm)
    assert new.app is not old.app and new.store.path == old.store.path
    return new


async def test_conversation_facts_reset_and_forget_survive_restarts(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "noted"
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.say("my kayak is named Bluebird")
        await h.say("!remember I paddle on Lake Mjøsa")
        await h.say("hello from bob", sender="bob")

        h = await _restart(h, tmp_path, fake_llm)
        await h.say("what is my kayak called?")
        prompt = _prompt(fake_llm)
        assert "my kayak is named Bluebird" in prompt and "Lake Mjøsa" in prompt
        assert "hello from bob" not in prompt
        await h.say("!history 4")
        assert "my kayak is named Bluebird" in h.transport.texts()[-1]
        await h.say("!reset")

        h = await _restart(h, tmp_path, fake_llm)
        await h.say("what is my kayak Bluebird called?")
        prompt = _prompt(fake_llm)
        assert "Bluebird called?" in prompt  # the new question ...
        assert "my kayak is named Bluebird" not in prompt  # ... but nothing from before !reset
        assert "Lake Mjøsa" in prompt  # pinned facts stay
        await h.say("!forget")

        h = await _restart(h, tmp_path, fake_llm)
        await h.say("!forget yes")  # the confirmation does not survive a restart
        assert h.transport.texts()[-1].startswith("Nothing to confirm")
        await h.say("!forget")
        await h.say("!forget yes")
        assert h.transport.texts()[-1].startswith("Deleted everything I kept about you")

        h = await _restart(h, tmp_path, fake_llm)
        await h.say("do you know me?")
        prompt = _prompt(fake_llm)
        assert "Bluebird" not in prompt and "Mjøsa" not in prompt
        rows = await h.store._all(
            "SELECT c.person, m.text FROM messages m JOIN conversations c "
            "ON c.id = m.conversation_id ORDER BY m.id"
        )
        assert [tuple(r) for r in rows] == [
            ("bob", "hello from bob"),
            ("bob", "noted"),
            ("alice", "do you know me?"),
            ("alice", "noted"),
        ]
    finally:
        await h.app.close()
