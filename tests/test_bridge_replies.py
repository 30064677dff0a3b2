"""The bridge keeps replies and reactions, and limits mesh -> Discord without losing anything.

Through the real transports: the unmodified meshtastic interface against the fake radio and
discord.py against the fake Discord (``tests.test_bridge.rig``); the limiter and digest with
in-process sides on a fake clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bot.bridge import Bridge, DiscordReaction, DiscordText, MeshText
from bot.config import RelayConfig
from tests.fakes import fake_radio as radio
from tests.fakes.fake_discord import BOT_ID, FakeDiscord, user
from tests.test_bridge import RELAY_CHANNEL, FullMesh, Said, SentMesh, relay_message, rig


def _on_air(r: Any) -> list[Any]:
    return [p for _, p in r.mesh.radio.sent_texts()]


async def test_a_mesh_reply_to_a_relayed_discord_message_is_a_discord_reply(
    fake_discord: FakeDiscord,
) -> None:
    fake_discord.webhooks_allowed = False  # posted as the bot: a real Discord reply
    async with rig(fake_discord) as r:
        original = await fake_discord.say(relay_message(fake_discord, "who has the key?"))
        await r.on_air(1)
        await r.bridge.idle()
        [packet] = _on_air(r)
        r.mesh.radio.inject_text("I do", to=radio.BROADCAST, frm=radio.BOB, reply_id=packet.id)
        await r.mesh.until(lambda: bool(r.posts()), "the reply on Discord")
        [post] = r.posts()
        assert post.content.endswith("): I do")
        assert int(post.payload["message_reference"]["message_id"]) == int(original["id"])


async def test_through_a_webhook_a_mesh_reply_quotes_what_it_answers(
    fake_discord: FakeDiscord,
) -> None:
    async with rig(fake_discord) as r:
        await fake_discord.say(relay_message(fake_discord, "who has the key?"))
        await r.on_air(1)
        await r.bridge.idle()
        [packet] = _on_air(r)
        r.mesh.radio.inject_text("I do", to=radio.BROADCAST, frm=radio.BOB, reply_id=packet.id)
        r.mesh.radio.inject_text("me too", to=radio.BROADCAST, frm=radio.BOB, reply_id=424242)
        await r.mesh.until(lambda: len(r.posts()) == 2, "both posts")
        contents = sorted(p.content for p in r.posts())
        assert contents == ["> Alice: who has the key?\nI do", "me too"]  # unknown target: plain


async def test_a_discord_reply_to_a_relayed_mesh_message_goes_on_air_as_a_reply(
    fake_discord: FakeDiscord,
) -> None:
    async with rig(fake_discord) as r:
        pid = r.mesh.radio.inject_text("road closed at the bridge", to=radio.BROADCAST)
        await r.mesh.until(lambda: bool(r.posts()), "the relayed post")
        await r.bridge.idle()
        [relayed] = r.posts()
        answer = relay_message(fake_discord, "thanks!")
        answer["message_reference"] = {
            "message_id": str(relayed.id),
            "channel_id": str(RELAY_CHANNEL),
        }
        await fake_discord.say(answer)
        await r.on_air(1)
        [packet] = _on_air(r)
        assert packet.decoded.payload.decode() == "Alice: thanks!"
        assert packet.decoded.reply_id == pid and not packet.decoded.emoji


async def test_a_mesh_tapback_becomes_a_reaction_and_an_unknown_one_is_counted(
    fake_discord: FakeDiscord,
) -> None:
    async with rig(fake_discord) as r:
        pid = r.mesh.radio.inject_text("battery at 20%", to=radio.BROADCAST)
        await r.mesh.until(lambda: bool(r.posts()), "the relayed post")
        await r.bridge.idle()
        [relayed] = r.posts()
        node = r.mesh.radio
        node.inject_text("👍", to=radio.BROADCAST, frm=radio.BOB, reply_id=pid, emoji=1)
        node.inject_text("❤️", to=radio.BROADCAST, frm=radio.BOB, reply_id=987654, emoji=1)
        await r.mesh.until(lambda: r.bridge.counters["reactions_unmatched"] == 1, "the stray")
        await r.mesh.until(lambda: bool(fake_discord.reactions), "the reaction")
        await r.bridge.idle()
        assert fake_discord.reactions == [(relayed.id, "👍")]
        assert len(r.posts()) == 1  # a tapback is never posted as text
        assert r.bridge.counters["reactions_to_discord"] == 1


async def test_a_discord_reaction_goes_on_air_as_a_tapback_and_a_flood_is_limited(
    fake_discord: FakeDiscord,
) -> None:
    async with rig(fake_discord, relay={"author_messages": 2}) as r:
        pid = r.mesh.radio.inject_text("sunset from the hill", to=radio.BROADCAST)
        await r.mesh.until(lambda: bool(r.posts()), "the relayed post")
        await r.bridge.idle()
        [relayed] = r.posts()
        await fake_discord.react(relayed.id, "BOT", by=user(BOT_ID, "meshsage", bot=True),
                                 channel_id=RELAY_CHANNEL)  # fmt: skip
        for emoji in ("😀", "🔥", "🎉", "👏"):  # alice: 2 allowed per window, then refused
            await fake_discord.react(relayed.id, emoji, channel_id=RELAY_CHANNEL)
        await r.on_air(2)
        await r.mesh.until(lambda: r.bridge.counters["refused"] == 2, "the refusals")
        await r.bridge.idle()
        packets = _on_air(r)
        assert [p.decoded.payload.decode() for p in packets] == ["😀", "🔥"]
        assert all(p.decoded.emoji == 1 and p.decoded.reply_id == pid for p in packets)
        notices = [p for p in r.posts() if p.content.startswith("Reactions are relayed")]
        assert len(notices) == 1  # one notice per window, not one per reaction
        assert r.bridge.counters["reactions_to_mesh"] == 2


async def test_a_reaction_on_a_message_never_relayed_stays_on_discord() -> None:
    mesh = SentMesh()
    cfg = RelayConfig.model_validate({"pairs": [{"mesh_channel": 0, "discord_channel": 5}]})
    bridge = Bridge(cfg, mesh=mesh, discord=Said(), clock=lambda: 0.0)
    bridge.discord_heard(DiscordText(5, 100, "alice", 1, "relayed"))
    await bridge.idle()  # on air: its packet id is known
    bridge.discord_reaction(DiscordReaction(5, 123, "👍", user_id=1))  # never relayed
    bridge.discord_reaction(DiscordReaction(5, 100, "👍", user_id=1))
    await bridge.idle()
    assert mesh.sent == ["alice: relayed", "👍"]
    assert bridge.counters["reactions_unmatched"] == 1
    assert bridge.counters["reactions_to_mesh"] == 1


async def test_a_mesh_burst_is_limited_and_the_excess_posted_as_one_digest() -> None:
    """20 packets from 20 nodes in one second: 5 posts at once (the channel's window), the
    other 15 together in one digest when the window has room; all 20 reach Discord."""
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        await asyncio.sleep(0)

    said = Said()
    cfg = RelayConfig.model_validate({"pairs": [{"mesh_channel": 0, "discord_channel": 5}]})
    bridge = Bridge(cfg, mesh=FullMesh(), discord=said, clock=lambda: now[0], sleep=sleep)
    for i in range(20):
        now[0] = i * 0.05
        bridge.mesh_heard(MeshText(f"!0000{i:04x}", f"N{i}", 0, 100 + i, f"hello {i}"))
    await bridge.idle()
    posts = [text for kind, text in said.calls if kind == "post"]
    assert posts[:5] == [f"hello {i}" for i in range(5)]
    [digest] = posts[5:]
    assert digest.startswith("-# 15 more from the mesh, over the relay limit")
    assert all(f"hello {i}" in digest for i in range(5, 20))
    assert bridge.counters["mesh_to_discord"] == 20 and bridge.counters["digests"] == 1
    assert now[0] >= 10.0  # the digest waited for the channel's window


async def test_one_chatty_node_is_limited_but_loses_nothing() -> None:
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        await asyncio.sleep(0)

    said = Said()
    cfg = RelayConfig.model_validate(
        {"pairs": [{"mesh_channel": 0, "discord_channel": 5}], "mesh_channel_messages": 100}
    )
    bridge = Bridge(cfg, mesh=FullMesh(), discord=said, clock=lambda: now[0], sleep=sleep)
    for i in range(9):
        now[0] = i * 1.0
        bridge.mesh_heard(MeshText("!a11ce001", "ALC", 0, 200 + i, f"line {i}"))
    bridge.mesh_heard(MeshText("!b0b00002", "BOB", 0, 300, "other node"))
    await bridge.idle()
    posts = [text for kind, text in said.calls if kind == "post"]
    assert posts[:5] == [f"line {i}" for i in range(5)]  # the node's own window
    rest = "\n".join(posts[5:])
    assert all(f"line {i}" in rest for i in range(5, 9)) and "other node" in rest
    assert bridge.counters["mesh_to_discord"] == 10
