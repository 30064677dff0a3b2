"""A post answered 429 without the ``Via`` header (discord.py raises it at once instead of
waiting): the answer stays in the outbox and is posted once on a later round (it used to be
``failed``: 0 posts, no notice, no retry)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_llm import FakeLLM
from tests.test_discord_app import running


@pytest.mark.parametrize("stream", [False, True])
async def test_a_429_without_via_is_retried_through_the_outbox(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, stream: bool
) -> None:
    keys = f"  stream: {str(stream).lower()}\n"
    async with running(tmp_path, fake_llm, fake_discord, discord_keys=keys) as rig:
        # streamed: the first words' post, then the finish's post are refused
        fake_discord.posts_429 = 2 if stream else 1
        await fake_discord.say(fake_discord.dm_message("are you there?"))
        for _ in range(500):  # until the post was tried (the gateway event is async)
            if fake_discord.posts_429 == 0 and rig.app.responder.idle:
                break
            await asyncio.sleep(0.01)
        await rig.app.responder.wait_idle()
        assert fake_discord.sent == [] and fake_discord.rate_limited == (2 if stream else 1)
        assert len(await rig.app.store.undelivered(transports=("discord",))) == 1
        assert await rig.app.responder.redeliver() == 1
        await rig.app.responder.wait_idle()
        assert [s.content for s in fake_discord.sent] == ["Hello from fake"]
        assert await rig.app.store.undelivered(transports=("discord",)) == []
