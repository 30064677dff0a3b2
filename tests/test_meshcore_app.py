"""The MeshCore transport inside the real app (responder, SQLite memory, the openai client over
HTTP to the fake LLM), through the unmodified meshcore library to the fake companion: a DM is
answered and stored under the sender's key; memory commands follow the key, never a channel."""

from __future__ import annotations

from pathlib import Path

from bot.app import build
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.meshcore_harness import meshcore_run


async def test_a_dm_is_answered_through_the_app_and_stored_under_the_key(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Paris is the capital of France."
    async with meshcore_run(start=False) as run:
        app = await build(
            make_config(tmp_path, fake_llm.base_url), env={}, transports=[run.transport]
        )
        try:
            await app.start()
            await run.until(lambda: run.transport.health().link == "up")
            alice = run.radio.person("Alice")
            run.radio.dm_from(alice, "capital of France?")
            await run.until(lambda: alice.shown == ["Paris is the capital of France."])
            await app.responder.wait_idle()
            rows = await app.store._all(
                "SELECT c.transport, c.person, m.role, m.status FROM messages m JOIN "
                "conversations c ON c.id = m.conversation_id ORDER BY m.id"
            )
            key = alice.key.hex()
            assert [tuple(r) for r in rows] == [
                ("meshcore", key, "user", "answered"),
                ("meshcore", key, "assistant", "delivered"),
            ]
            run.radio.channel_text(0, "Alice", "!forget")  # a channel never reaches DM memory
            await run.until(lambda: len(run.radio.channel_shown(0)) == 1)
            await app.responder.wait_idle()
            (said,) = run.radio.channel_shown(0)
            assert b"DM me !forget" in said
            assert len(await app.store._all("SELECT id FROM messages")) >= 2
        finally:
            await app.close()
