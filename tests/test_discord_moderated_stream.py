"""A moderator deleting one message of a live streamed answer: that part stays deleted, the
rest of the answer grows and finishes, and the answer is delivered (it used to end the whole
answer ``failed``)."""

from __future__ import annotations

import asyncio

from bot.config import DiscordConfig
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply
from bot.transports.discord import build_discord
from tests.fakes.fake_discord import CHANNEL_ID, TOKEN, FakeDiscord
from tests.test_discord_transport import ManualClock


async def test_a_part_deleted_by_a_moderator_does_not_fail_the_answer(
    fake_discord: FakeDiscord,
) -> None:
    clock = ManualClock()
    fake_discord.clock = clock
    config = DiscordConfig(channels=(CHANNEL_ID,), stream_edit_seconds=1.0)
    transport = build_discord(config, env={"DISCORD_TOKEN": TOKEN}, clock=clock, sleep=clock.sleep)
    text = " ".join(f"sentence{i:03d}." for i in range(200))  # two messages
    done: list[Delivery] = []

    async def respond(inbound: Inbound) -> None:
        stream = transport.stream(inbound)
        assert stream is not None
        words = text.split(" ")
        for i in range(1, len(words) + 1):
            await stream.update(" ".join(words[:i]))
            if i == 40:  # the first message is still growing when it is deleted
                fake_discord.delete_by_moderator(fake_discord.sent[0].id)
            clock.now += 0.3
        done.append(await stream.finish(Reply(inbound=inbound, text=transport.fit(text))))

    await transport.start(respond)
    await asyncio.wait_for(fake_discord.ready.wait(), 5)
    try:
        await fake_discord.say(fake_discord.guild_message("tell me", mention_bot=True))
        for _ in range(1000):
            if done:
                break
            await asyncio.sleep(0.01)
    finally:
        await transport.stop()
    [delivery] = done
    assert delivery.status is DeliveryStatus.DELIVERED
    first, second = fake_discord.sent
    assert [s.id for s in fake_discord.visible(CHANNEL_ID)] == [second.id]
    assert first.id in fake_discord.deleted
    assert second.content.endswith("sentence199.")  # the rest of the answer came, whole
