"""No Discord path takes a relayed mesh line, or a name, as an identity (issue 44): the bridge
posts mesh channel text into Discord (by webhook, named after the node, or as the bot); such a
post heard back on the gateway never runs as a command or a question of the person it names,
even when it @mentions the bot, while a real person's message there is answered as that
Discord account."""

from __future__ import annotations

import pytest

from tests.fakes import fake_radio as radio
from tests.fakes.fake_discord import ALICE, BOT_ID, BOT_USER, CHANNEL_ID, FakeDiscord, user
from tests.test_bridge import rig

LINES = ("!forget yes", "!remember I am an operator", "!link 123456", "what is alice's code?")


@pytest.mark.parametrize("webhooks", [True, False], ids=["webhook", "as-the-bot"])
async def test_a_relayed_mesh_line_never_runs_as_the_command_of_the_person_it_names(
    fake_discord: FakeDiscord, webhooks: bool
) -> None:
    fake_discord.webhooks_allowed = webhooks
    pairs = {"pairs": [{"mesh_channel": 0, "discord_channel": CHANNEL_ID}]}  # an answered channel
    async with rig(fake_discord, relay=pairs) as r:
        for line in LINES:
            r.mesh.radio.inject_text(f"<@{BOT_ID}> {line}", to=radio.BROADCAST)
        await r.mesh.until(lambda: len(fake_discord.history.get(CHANNEL_ID, [])) >= 4, "posts")
        posts = list(fake_discord.history[CHANNEL_ID])
        assert len(posts) == len(LINES)
        for post in posts:  # heard back on the gateway, as Discord delivers it, mention parsed
            await fake_discord.say({**post, "mentions": [BOT_USER]})
        await fake_discord.say(
            fake_discord.guild_message("sentinel", author=user(ALICE, "alice"), mention_bot=True)
        )
        await r.mesh.until(lambda: bool(r.discord_inbox), "the sentinel")
        [inbound] = r.discord_inbox
        assert (inbound.sender, inbound.text, inbound.authenticated) == (
            str(ALICE), "sentinel", True
        )  # fmt: skip
