"""The mesh <-> Discord bridge end to end: the real Meshtastic transport against the fake radio
(virtual clock, on-air spacing checked at exit) and discord.py against the fake Discord."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bot.bridge import CUT_REACTION, FAILED_REACTION, REFUSED_REACTION, Bridge, DiscordText
from bot.config import DiscordConfig, RelayConfig
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply
from bot.transports.discord import DiscordTransport, build_discord
from tests.fakes import fake_radio as radio
from tests.fakes.fake_discord import (
    ALICE,
    BOB,
    CHANNEL_ID,
    OTHER_CHANNEL_ID,
    TOKEN,
    FakeDiscord,
    Sent,
    user,
)
from tests.fakes.mesh_harness import Harness, mesh_harness

RELAY_CHANNEL = OTHER_CHANNEL_ID  # the bridge's channel; CHANNEL_ID is where the AI answers


@dataclass
class Rig:
    mesh: Harness
    fake: FakeDiscord
    discord: DiscordTransport
    bridge: Bridge
    now: list[float]
    discord_inbox: list[Inbound] = field(default_factory=list)
    heard: list[DiscordText] = field(default_factory=list)

    def posts(self) -> list[Sent]:
        return [s for s in self.fake.sent if s.channel_id == RELAY_CHANNEL]

    async def heard_count(self, n: int) -> None:
        await self.mesh.until(lambda: len(self.heard) >= n, f"{n} Discord message(s) seen")

    async def on_air(self, n: int) -> list[str]:
        await self.mesh.until(lambda: len(self.mesh.radio.texts()) >= n, f"{n} packet(s)")
        return self.mesh.radio.texts()


@contextlib.asynccontextmanager
async def rig(
    fake_discord: FakeDiscord, *, relay: dict[str, Any] | None = None, **mesh: Any
) -> AsyncIterator[Rig]:
    cfg = RelayConfig.model_validate(
        {
            "pairs": [{"mesh_channel": 0, "discord_channel": RELAY_CHANNEL}],
            **(relay or {}),
        }
    )
    now = [0.0]
    async with mesh_harness(channels=[0], **mesh) as h:
        transport = build_discord(
            DiscordConfig(channels=(CHANNEL_ID,)), env={"DISCORD_TOKEN": TOKEN}
        )
        side = transport.attach_relay(cfg)
        bridge = Bridge(cfg, mesh=h.transport, discord=side, clock=lambda: now[0])
        side.bind(bridge)
        h.transport.channel_listener = bridge.mesh_heard
        r = Rig(h, fake_discord, transport, bridge, now)
        heard = bridge.discord_heard

        def record(msg: DiscordText) -> None:
            r.heard.append(msg)
            heard(msg)

        side._heard = record

        async def answer(inbound: Inbound) -> None:
            r.discord_inbox.append(inbound)
            await transport.send(Reply(inbound=inbound, text="answer"))

        await transport.start(answer)
        await asyncio.wait_for(fake_discord.ready.wait(), 5)
        try:
            yield r
        finally:
            await bridge.idle()
            await bridge.close()
            await transport.stop()


def relay_message(fake: FakeDiscord, text: str, author: int = ALICE, **kw: Any) -> dict[str, Any]:
    name = "alice" if author == ALICE else "bob"
    return fake.guild_message(text, author=user(author, name), channel_id=RELAY_CHANNEL, **kw)


async def test_channel_packet_appears_on_discord_once(fake_discord: FakeDiscord) -> None:
    async with rig(fake_discord) as r:
        node = r.mesh.radio
        pid = node.inject_text("anyone near the ridge?", to=radio.BROADCAST)
        node.inject_text("anyone near the ridge?", to=radio.BROADCAST, pid=pid)  # retransmit
        node.inject_text("via the internet", to=radio.BROADCAST, via_mqtt=True, frm=radio.BOB)
        node.inject_text("our own", to=radio.BROADCAST, frm=radio.MY_NUM)
        node.inject_text("a DM to the bot", to=radio.MY_NUM)  # answered, never relayed
        node.inject_text("on channel 1", to=radio.BROADCAST, channel=1)  # not paired
        node.inject_text("@meshsage what time is it", to=radio.BROADCAST)  # for the AI
        node.inject_text("sentinel", to=radio.BROADCAST, frm=radio.BOB)
        await r.mesh.until(lambda: any(p.content == "sentinel" for p in r.posts()), "sentinel")
        await r.mesh.message(2)  # the DM and the trigger reached the responder
        await r.bridge.idle()
        posts = r.posts()
        assert sorted(p.content for p in posts) == ["anyone near the ridge?", "sentinel"]
        names = {p.content: p.payload["username"] for p in posts}
        assert names["anyone near the ridge?"] == f"ALC (!{radio.ALICE:08x})"  # webhook author
        assert all(p.payload["allowed_mentions"] == {"parse": []} for p in posts)
        assert r.bridge.counters["mesh_to_discord"] == 2
        assert [i.text for i in r.mesh.inbox] == ["a DM to the bot", "what time is it"]


async def test_without_webhook_permission_posts_as_the_bot(fake_discord: FakeDiscord) -> None:
    fake_discord.webhooks_allowed = False
    async with rig(fake_discord) as r:
        r.mesh.radio.inject_text("hello *all*", to=radio.BROADCAST)
        await r.mesh.until(lambda: bool(r.posts()), "a post")
        [post] = r.posts()
        assert post.content == f"**ALC** (!{radio.ALICE:08x}): hello *all*"


async def test_discord_text_goes_on_air_chunked_paced_and_shares_spacing(
    fake_discord: FakeDiscord,
) -> None:
    long = "the trail is closed after the bridge washed out. " * 6  # ~300 bytes
    async with rig(fake_discord) as r:
        # A bot answer and the relayed text wait in the same outbox: spacing holds across both
        # (checked on the radio's clock when the harness exits).
        r.mesh.radio.inject_text("hi bot", to=radio.MY_NUM)
        dm = await r.mesh.message(1)
        answer = asyncio.create_task(r.mesh.reply(dm, "an answer " * 30))
        await fake_discord.say(
            relay_message(fake_discord, long + f"ping <@{BOB}>", mentions=(user(BOB, "bob"),))
        )
        texts = await r.on_air(4)
        assert (await answer).status is not DeliveryStatus.FAILED
        relayed = [t for t in texts if "alice:" in t or "washed" in t]
        assert relayed[0].startswith("(1/2) Alice: the trail is closed")
        assert relayed[1].startswith("(2/2) ")
        assert all(len(t.encode()) <= 200 for t in texts)
        await r.bridge.idle()
        assert r.bridge.counters["discord_to_mesh"] == 1
        packets = [p for p in r.mesh.radio.sent_packets() if p.decoded.payload]
        assert all(p.to == radio.BROADCAST and p.channel == 0 for p in packets[-2:])


async def test_mentions_reach_the_mesh_as_names(fake_discord: FakeDiscord) -> None:
    async with rig(fake_discord) as r:
        msg = relay_message(
            fake_discord, f"ask <@{BOB}> in <#{CHANNEL_ID}>", mentions=(user(BOB, "bob"),)
        )
        await fake_discord.say(msg)
        [text] = await r.on_air(1)
        assert text == "Alice: ask @Bob in #meshsage"


async def test_no_echo_either_way(fake_discord: FakeDiscord) -> None:
    async with rig(fake_discord) as r:
        r.mesh.radio.inject_text("from the mesh", to=radio.BROADCAST)
        await r.mesh.until(lambda: bool(r.posts()), "a post")
        # The webhook post arrives on the gateway like any message: it is not relayed back.
        [post] = r.posts()
        hook = fake_discord.history[RELAY_CHANNEL][-1]
        assert hook["webhook_id"]
        await fake_discord.say(hook)
        # Our own relayed packet, heard back from the mesh, is not posted again.
        await fake_discord.say(relay_message(fake_discord, "to the mesh"))
        [text] = await r.on_air(1)
        r.mesh.radio.inject_text(text, to=radio.BROADCAST, frm=radio.MY_NUM)
        r.mesh.radio.inject_text("sentinel", to=radio.BROADCAST)
        await r.mesh.until(lambda: len(r.posts()) >= 2, "sentinel post")
        await r.heard_count(2)
        await r.bridge.idle()
        assert [p.content for p in r.posts()] == ["from the mesh", "sentinel"]
        assert r.mesh.radio.texts() == ["Alice: to the mesh"]
        assert post.content == "from the mesh"


async def test_dms_and_messages_for_the_ai_are_not_relayed(fake_discord: FakeDiscord) -> None:
    async with rig(fake_discord) as r:
        await fake_discord.say(fake_discord.dm_message("a private thought"))
        await fake_discord.say(relay_message(fake_discord, "question for the AI", mention_bot=True))
        await fake_discord.say(relay_message(fake_discord, "sentinel"))
        [text] = await r.on_air(1)
        assert text == "Alice: sentinel"
        await r.bridge.idle()
        assert [i.text for i in r.discord_inbox] == ["a private thought"]
        assert r.bridge.stats() == {
            "relay mesh_to_discord": 0,
            "relay discord_to_mesh": 1,
            "relay cut": 0,
            "relay refused": 0,
        }


async def test_text_longer_than_the_parts_is_cut_and_marked(fake_discord: FakeDiscord) -> None:
    async with rig(fake_discord, relay={"max_parts": 1}) as r:
        sent = await fake_discord.say(relay_message(fake_discord, "word " * 100))
        [text] = await r.on_air(1)
        assert text.endswith("…") and len(text.encode()) <= 200
        await r.bridge.idle()
        assert (int(sent["id"]), CUT_REACTION) in fake_discord.reactions
        assert r.bridge.counters["cut"] == 1


async def test_flood_is_rate_limited_with_a_notice_and_nothing_lost(
    fake_discord: FakeDiscord,
) -> None:
    """50 messages from 5 people in 10 s: each one is either on air or marked refused."""
    relay = {"channel_messages": 8, "channel_seconds": 60, "author_messages": 3}
    async with rig(fake_discord, relay=relay) as r:
        ids: list[int] = []
        for i in range(50):
            r.now[0] = i * 0.2
            author = ALICE if i % 5 == 0 else BOB if i % 5 == 1 else 930_000_000_000_000_100 + i % 5
            data = fake_discord.guild_message(
                f"flood {i}", author=user(author, f"user{i % 5}"), channel_id=RELAY_CHANNEL
            )
            ids.append(int((await fake_discord.say(data))["id"]))
            await r.heard_count(i + 1)
        await r.on_air(8)
        await r.bridge.idle()
        counters = r.bridge.counters
        assert counters["discord_to_mesh"] == 8
        assert counters["refused"] == 42
        refused = {mid for mid, emoji in fake_discord.reactions if emoji == REFUSED_REACTION}
        on_air = {int(t.split("flood ")[1]) for t in r.mesh.radio.texts()}
        assert len(on_air) == 8
        assert refused | {ids[i] for i in on_air} == set(ids)  # nothing lost silently
        notices = [s for s in r.posts() if s.content.startswith("Not relayed to the mesh")]
        assert len(notices) == 1  # one notice per window, not one per message


class FullMesh:
    """A mesh side whose outbox is full."""

    def fit_relay(self, text: str, *, max_parts: int) -> str:
        return text

    async def broadcast(
        self,
        channel: int,
        text: str,
        *,
        person: str,
        max_parts: int,
        reply_id: int | None = None,
        tapback: bool = False,
    ) -> Delivery:
        return Delivery(DeliveryStatus.FAILED, detail="outbox full")


class SentMesh(FullMesh):
    """A mesh side that sends everything at once; ``sent`` is each text, in order."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def broadcast(
        self,
        channel: int,
        text: str,
        *,
        person: str,
        max_parts: int,
        reply_id: int | None = None,
        tapback: bool = False,
    ) -> Delivery:
        self.sent.append(text)
        return Delivery(DeliveryStatus.SENT, message_ids=(str(1000 + len(self.sent)),))


class Said:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def relay_post(
        self,
        channel_id: int,
        *,
        name: str,
        node: str,
        text: str,
        reply_to: int | None = None,
        quote: str | None = None,
    ) -> int | None:
        self.calls.append(("post", text))
        return 1000 + len(self.calls)

    async def relay_react(self, channel_id: int, message_id: int, emoji: str) -> None:
        self.calls.append(("react", emoji))

    async def relay_notice(self, channel_id: int, message_id: int, text: str) -> None:
        self.calls.append(("notice", text))


async def test_outbox_full_is_told_on_discord() -> None:
    said = Said()
    cfg = RelayConfig.model_validate({"pairs": [{"mesh_channel": 0, "discord_channel": 5}]})
    bridge = Bridge(cfg, mesh=FullMesh(), discord=said, clock=lambda: 0.0)
    for i in range(2):
        bridge.discord_heard(DiscordText(5, 100 + i, "alice", 1, f"hello {i}"))
    await bridge.idle()
    assert said.calls.count(("react", FAILED_REACTION)) == 2
    assert [c for c in said.calls if c[0] == "notice"] == [
        ("notice", "Not relayed to the mesh: the radio's outbox is full. Messages marked ⚠️ "
         "were not sent; try again in a few minutes.")
    ]  # fmt: skip
    assert bridge.counters["refused"] == 2


@pytest.mark.parametrize(
    ("direction", "mesh_to_discord", "discord_to_mesh"),
    [("mesh_to_discord", True, False), ("discord_to_mesh", False, True), ("both", True, True)],
)
async def test_direction_is_respected(
    direction: str, mesh_to_discord: bool, discord_to_mesh: bool
) -> None:
    from bot.bridge import MeshText

    said = Said()
    mesh = SentMesh()
    sent = mesh.sent

    cfg = RelayConfig.model_validate(
        {"pairs": [{"mesh_channel": 2, "discord_channel": 5, "direction": direction}]}
    )
    bridge = Bridge(cfg, mesh=mesh, discord=said, clock=lambda: 0.0)
    bridge.mesh_heard(MeshText("!a11ce001", "ALC", 2, 7, "from mesh"))
    bridge.discord_heard(DiscordText(5, 1, "alice", 1, "from discord"))
    await bridge.idle()
    assert (("post", "from mesh") in said.calls) is mesh_to_discord
    assert (sent == ["alice: from discord"]) is discord_to_mesh


async def test_relay_without_both_transports_says_how_to_fix(tmp_path: Any, fake_llm: Any) -> None:
    from bot.app import build
    from bot.errors import MeshsageError
    from tests.conftest import make_config

    extra = (
        f"discord:\n  channels: [{CHANNEL_ID}]\n"
        f"relay:\n  pairs:\n    - {{mesh_channel: 0, discord_channel: {RELAY_CHANNEL}}}\n"
    )
    config = make_config(tmp_path, fake_llm.base_url, extra)
    with pytest.raises(MeshsageError, match="relay: pairs need both"):
        await build(config, env={"DISCORD_TOKEN": TOKEN})


async def test_stats_show_relay_counters(fake_discord: FakeDiscord, tmp_path: Any) -> None:
    from bot.commands import Commands
    from bot.commands_facts import FactCommands
    from bot.llm.tokens import make_counter
    from bot.memory.links import LinkCodes
    from bot.memory.store import SqliteStore

    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        facts = FactCommands(store=store, counter=make_counter(), prefix="!", max_facts=5)
        commands = Commands(
            store=store, facts=facts, prefix="!", operators=(), model_name=lambda: "m",
            links=LinkCodes(store),
        )  # fmt: skip
        async with rig(fake_discord) as r:
            commands.stat_sources.append(r.bridge.stats)
            await fake_discord.say(relay_message(fake_discord, "hello mesh"))
            await r.on_air(1)
            await r.bridge.idle()
            result = await commands.run(
                Inbound("console", "op", "!stats", authenticated=True), "stats", ""
            )
        assert result.text.endswith(
            "relay mesh_to_discord: 0, relay discord_to_mesh: 1, relay cut: 0, relay refused: 0"
        )
    finally:
        await store.close()


async def test_app_wires_the_bridge_and_stores_no_relayed_chatter(
    fake_discord: FakeDiscord, fake_llm: Any, tmp_path: Any
) -> None:
    """The real app: relayed chatter reaches neither the responder nor the database, while
    a trigger on the same mesh channel is answered (and not relayed)."""
    from bot.app import build
    from tests.conftest import make_config

    extra = (
        f"discord:\n  channels: [{CHANNEL_ID}]\n  stream: false\n"
        f"relay:\n  pairs:\n    - {{mesh_channel: 0, discord_channel: {RELAY_CHANNEL}}}\n"
    )
    config = make_config(tmp_path, fake_llm.base_url, extra)
    assert config.discord is not None
    async with mesh_harness(start=False, channels=[0]) as h:
        chat = build_discord(config.discord, env={"DISCORD_TOKEN": TOKEN})
        app = await build(config, env={}, transports=[h.transport, chat])
        await app.start()
        try:
            await asyncio.wait_for(fake_discord.ready.wait(), 5)
            await h.connected()
            assert app.bridge is not None
            h.radio.inject_text("chatter on the mesh", to=radio.BROADCAST)
            await fake_discord.say(relay_message(fake_discord, "chatter on discord"))
            await h.until(lambda: bool(h.radio.texts()), "relayed text on air")
            h.radio.inject_text("@meshsage hello", to=radio.BROADCAST)
            await h.until(lambda: len(h.radio.texts()) >= 2, "the answer on air")
            await app.bridge.idle()
            await app.responder.wait_idle()
            posted = [s.content for s in fake_discord.sent if s.channel_id == RELAY_CHANNEL]
            assert posted == ["chatter on the mesh"]
            assert h.radio.texts() == ["Alice: chatter on discord", "Hello from fake"]
            stats = await app.store.stats()
            assert stats["messages"] == 2  # the trigger and its answer; no chatter
        finally:
            await app.close()


async def test_signal_shown_when_configured() -> None:
    from bot.bridge import MeshText

    said = Said()
    cfg = RelayConfig.model_validate(
        {"pairs": [{"mesh_channel": 0, "discord_channel": 5}], "show_signal": True}
    )
    bridge = Bridge(cfg, mesh=FullMesh(), discord=said, clock=lambda: 0.0)
    bridge.mesh_heard(MeshText("!a11ce001", "ALC", 0, 7, "hi", hops=2, snr=6.5))
    bridge.mesh_heard(MeshText("!a11ce001", "ALC", 0, 7, "hi", hops=2, snr=6.5))  # retransmit
    await bridge.idle()
    assert said.calls == [("post", "hi\n-# 2 hop(s), SNR 6.5 dB")]


async def test_attachments_go_to_the_mesh_as_markers(fake_discord: FakeDiscord) -> None:
    async with rig(fake_discord) as r:
        data = relay_message(fake_discord, "look")
        data["attachments"] = [
            fake_discord.attachment("cat.png", b"png", "image/png"),
            fake_discord.attachment("notes.pdf", b"pdf", "application/pdf"),
        ]
        await fake_discord.say(data)
        only = relay_message(fake_discord, "")
        only["attachments"] = [fake_discord.attachment("dog.jpg", b"jpg", "image/jpeg")]
        await fake_discord.say(only)
        texts = await r.on_air(2)
        assert texts == ["Alice: look [image] [file]", "Alice: [image]"]
        assert not fake_discord.cdn_reads  # nothing downloaded for the mesh


async def test_a_refused_message_uses_no_rate_slot() -> None:
    said = Said()
    mesh = SentMesh()
    sent = mesh.sent

    cfg = RelayConfig.model_validate(
        {
            "pairs": [{"mesh_channel": 0, "discord_channel": 5}],
            "author_messages": 1,
            "channel_messages": 2,
        }
    )
    bridge = Bridge(cfg, mesh=mesh, discord=said, clock=lambda: 0.0)
    bridge.discord_heard(DiscordText(5, 1, "alice", 1, "one"))
    bridge.discord_heard(DiscordText(5, 2, "alice", 1, "two"))  # over alice's limit
    bridge.discord_heard(DiscordText(5, 3, "bob", 2, "three"))  # the channel still has room
    await bridge.idle()
    assert sent == ["alice: one", "bob: three"]
    assert bridge.counters["refused"] == 1


def test_status_file_carries_relay_counters() -> None:
    from bot.ops.status import Status, render

    counters = {"mesh_to_discord": 4, "discord_to_mesh": 2, "cut": 1, "refused": 3}
    status = Status(
        written_at=100.0, started_at=50.0, pid=1, version="x", healthy=True, relay=counters
    )
    again = Status.from_json(status.to_json())
    assert again.relay == counters
    lines, _ok = render(again, now=101.0)
    assert (
        "  relay:      4 mesh->discord, 2 discord->mesh, 1 cut, 3 refused, 0 digest(s), "
        "reactions 0 mesh->discord, 0 discord->mesh" in lines
    )
    plain, _ = render(Status(written_at=100.0, started_at=50.0, pid=1, version="x", healthy=True))
    assert not any("relay" in line for line in plain)  # no bridge, no line
