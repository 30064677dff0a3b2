"""An image question cut by a restart is answered with its image: the images are never
stored, so the transport reads the message again from Discord (it used to be answered from
the stored text alone, without the image or a note)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

from bot.app import build
from bot.transports.discord import build_discord
from tests.conftest import make_config
from tests.fakes.fake_discord import CHANNEL_ID, TOKEN, FakeDiscord
from tests.fakes.fake_llm import FakeLLM

PNG = b"\x89PNG\r\n\x1a\nfake image bytes"


async def _app(tmp_path: Path, fake_llm: FakeLLM):  # type: ignore[no-untyped-def]
    config = make_config(
        tmp_path,
        fake_llm.base_url,
        f"  vision: true\ndiscord:\n  channels: [{CHANNEL_ID}]\n  stream: false\n",
    )
    assert config.discord is not None
    chat = build_discord(config.discord, env={"DISCORD_TOKEN": TOKEN}, vision=True)
    app = await build(config, env={}, transports=[chat])
    await app.start()
    return app


async def test_an_image_question_cut_by_a_restart_is_answered_with_its_image(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    fake_llm.script = [("sleep", 60)]  # the model is still thinking when the bot stops
    app = await _app(tmp_path, fake_llm)
    # The stop cuts the call off either way (after 60% of the budget: 18 s by default); a
    # 3 s budget (as tests/test_stop_budget.py) cuts it after 1.8 s.
    app.stop_seconds = 3.0
    try:
        await asyncio.wait_for(fake_discord.ready.wait(), 30)
        data = fake_discord.dm_message("what is in this picture?")
        data["attachments"] = [fake_discord.attachment("cat.png", PNG, "image/png")]
        await fake_discord.say(data)
        for _ in range(1000):
            if fake_llm.chat_requests():
                break
            await asyncio.sleep(0.01)
    finally:
        await app.close()
    assert fake_discord.sent == []
    fake_discord.ready.clear()
    app = await _app(tmp_path, fake_llm)
    try:
        [sent] = await fake_discord.wait_sent(1)
        await app.responder.wait_idle()
        last = fake_llm.chat_requests()[-1]["messages"][-1]
        url = "data:image/png;base64," + base64.b64encode(PNG).decode()
        assert last["content"][1] == {"type": "image_url", "image_url": {"url": url}}
        assert sent.reference_id == int(data["id"])
        assert "could not be looked at" not in sent.content
    finally:
        await app.close()
