"""The Discord adapter driving the unmodified discord.py against a loopback Discord
(tests/fakes/fake_discord.py): gateway events in, REST calls out, no network.

Messages that must be ignored are followed by one that must be answered; events are handled
in order, so once the second is answered the first has been decided (no sleeps).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable

import discord
import pytest

from bot.config import DiscordConfig, MeshtasticConfig
from bot.domain import DM_SPACE, Attachment, DeliveryStatus, Inbound, Reply, ReplyKind
from bot.transports.discord import NO_MENTIONS, DiscordTransport, build_discord
from bot.transports.discord_text import _fence_toggle, split_message
from tests.fakes.fake_discord import (
    ALICE,
    BOB,
    BOT_ID,
    CHANNEL_ID,
    GUILD_ID,
    OTHER_BOT,
    OTHER_CHANNEL_ID,
    OTHER_THREAD_ID,
    ROLE_MEMBER,
    ROLE_MUTED,
    THREAD_ID,
    TOKEN,
    UNCACHED_GUILD_ID,
    FakeDiscord,
    Json,
    Sent,
    free_port,
    user,
)

CONFIG = DiscordConfig(channels=(CHANNEL_ID,))
SPACE = f"guild:{GUILD_ID}:ch:{CHANNEL_ID}"


class Echo:
    """A stand-in responder: records each inbound and answers it through the transport."""

    def __init__(self) -> None:
        self.inbox: list[Inbound] = []
        self.transport: DiscordTransport | None = None
        self.answer: Callable[[Inbound], Reply] = lambda i: Reply(inbound=i, text=f"echo {i.text}")
        self.deliveries: list[DeliveryStatus] = []
        self._delivered = asyncio.Event()

    async def wait_delivered(self, count: int) -> list[DeliveryStatus]:
        """Until ``count`` sends have returned (the fake records a post before it answers)."""

        async def enough() -> None:
            while len(self.deliveries) < count:
                self._delivered.clear()
                await self._delivered.wait()

        await asyncio.wait_for(enough(), 5)
        return self.deliveries

    async def __call__(self, inbound: Inbound) -> None:
        assert self.transport is not None
        self.inbox.append(inbound)
        async with self.transport.working(inbound):
            reply = self.answer(inbound)
        fitted = Reply(
            inbound=inbound,
            text=self.transport.fit(reply.text),
            kind=reply.kind,
            note=reply.note,
            attachments=reply.attachments,
        )
        self.deliveries.append((await self.transport.send(fitted)).status)
        self._delivered.set()


async def connect(
    fake_discord: FakeDiscord, echo: Echo, config: DiscordConfig = CONFIG, *, vision: bool = False
) -> DiscordTransport:
    transport = build_discord(config, env={"DISCORD_TOKEN": TOKEN}, vision=vision)
    echo.transport = transport
    await transport.start(echo)
    await asyncio.wait_for(fake_discord.ready.wait(), 5)
    return transport


@pytest.fixture
async def echo(fake_discord: FakeDiscord) -> AsyncIterator[Echo]:
    e = Echo()
    transport = await connect(fake_discord, e)
    yield e
    await transport.stop()
    await asyncio.wait_for(transport.wait_closed(), 5)


async def test_dm_answered_as_reply_with_typing(fake_discord: FakeDiscord, echo: Echo) -> None:
    msg = await fake_discord.say(fake_discord.dm_message("hello there"))
    [sent] = await fake_discord.wait_sent(1)

    [inbound] = echo.inbox
    assert inbound.transport == "discord"
    assert inbound.sender == str(ALICE)
    assert inbound.space == DM_SPACE
    assert inbound.text == "hello there"
    assert inbound.message_id == msg["id"]
    assert inbound.sender_name == "Alice"
    assert sent.channel_id == fake_discord.dm_channel_id(ALICE)
    assert sent.content == "echo hello there"
    assert sent.reference_id == int(msg["id"])
    assert fake_discord.typing == [fake_discord.dm_channel_id(ALICE)]
    assert await echo.wait_delivered(1) == [DeliveryStatus.DELIVERED]


async def test_typing_failure_does_not_fail_the_answer(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    fake_discord.typing_status = 403
    await fake_discord.say(fake_discord.dm_message("hello"))
    [sent] = await fake_discord.wait_sent(1)
    assert fake_discord.typing and sent.content == "echo hello"
    assert await echo.wait_delivered(1) == [DeliveryStatus.DELIVERED]


async def test_mention_in_allowed_channel_answered_as_reply(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    msg = await fake_discord.say(fake_discord.guild_message("what is LoRa?", mention_bot=True))
    [sent] = await fake_discord.wait_sent(1)

    [inbound] = echo.inbox
    assert inbound.text == "what is LoRa?"  # the mention is stripped
    assert inbound.space == SPACE
    assert inbound.sender == str(ALICE)
    assert sent.channel_id == CHANNEL_ID
    ref = sent.payload["message_reference"]
    assert int(ref["message_id"]) == int(msg["id"])
    assert ref["fail_if_not_exists"] is False
    # No pings from the bot, ever: not the author, not @everyone in an answer.
    assert sent.payload["allowed_mentions"] == {"parse": [], "replied_user": False}


def dm_with(bot_flag: bool) -> Callable[[FakeDiscord], Json]:
    return lambda f: f.dm_message("hi", author=user(OTHER_BOT, "otherbot", bot=bot_flag))


def from_webhook(f: FakeDiscord) -> Json:
    data = f.guild_message("hi", mention_bot=True, author=user(OTHER_BOT, "hook"))
    data["webhook_id"] = str(OTHER_BOT)
    return data


def empty_reply_to_bot(f: FakeDiscord) -> Json:
    """Without the message content intent a reply that does not ping us arrives empty."""
    earlier = Sent(
        channel_id=CHANNEL_ID, payload={"content": "an earlier answer"}, id=f.snowflake()
    )
    return f.guild_message("", reply_to=earlier)


IGNORED: dict[str, Callable[[FakeDiscord], Json]] = {
    "guild message without mention": lambda f: f.guild_message("hello all"),
    "mention in a channel not allowed": lambda f: f.guild_message(
        "hi", mention_bot=True, channel_id=OTHER_CHANNEL_ID
    ),
    "another bot mentioning us": lambda f: f.guild_message(
        "hi", mention_bot=True, author=user(OTHER_BOT, "otherbot", bot=True)
    ),
    "another bot's DM": dm_with(True),
    "our own message": lambda f: f.guild_message(
        "hi", mention_bot=True, author=user(BOT_ID, "meshsage", bot=True)
    ),
    "a webhook mentioning us": from_webhook,
    "mention in a thread of a channel not allowed": lambda f: f.guild_message(
        "hi", mention_bot=True, channel_id=OTHER_THREAD_ID
    ),
    "reply to the bot without content": empty_reply_to_bot,
    # No hidden DM path: a guild discord.py has not cached has no ``guild``, which must not
    # make the message a DM (answered unaddressed, outside the allowed channels).
    "a message from an uncached guild": lambda f: f.guild_message(
        "hi", guild_id=UNCACHED_GUILD_ID, channel_id=OTHER_CHANNEL_ID
    ),
    "a mention from an uncached guild": lambda f: f.guild_message(
        "hi", mention_bot=True, guild_id=UNCACHED_GUILD_ID
    ),
}


@pytest.mark.parametrize("case", list(IGNORED))
async def test_ignored(fake_discord: FakeDiscord, echo: Echo, case: str) -> None:
    await fake_discord.say(IGNORED[case](fake_discord))
    await fake_discord.say(
        fake_discord.guild_message("sentinel", mention_bot=True, author=user(BOB, "bob"))
    )
    [sent] = await fake_discord.wait_sent(1)
    assert [i.text for i in echo.inbox] == ["sentinel"]
    assert sent.content == "echo sentinel"


async def test_thread_in_an_allowed_channel_is_a_space_of_its_own(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    await fake_discord.say(
        fake_discord.guild_message("in the thread", mention_bot=True, channel_id=THREAD_ID)
    )
    [sent] = await fake_discord.wait_sent(1)
    [inbound] = echo.inbox
    assert inbound.space == f"guild:{GUILD_ID}:ch:{THREAD_ID}" != SPACE
    assert (sent.channel_id, sent.content) == (THREAD_ID, "echo in the thread")


RESTRICTED = DiscordConfig(
    channels=(CHANNEL_ID,),
    dms=False,
    blocked_users=(BOB,),
    allowed_roles=(ROLE_MEMBER,),
    blocked_roles=(ROLE_MUTED,),
)


async def test_user_and_role_lists_read_from_discord_messages(fake_discord: FakeDiscord) -> None:
    """The roles come from the member data discord.py attaches to each guild message."""
    echo = Echo()
    transport = await connect(fake_discord, echo, RESTRICTED)
    try:
        for data in (
            fake_discord.dm_message("a DM (DMs are off)"),
            fake_discord.guild_message("no role", mention_bot=True),
            fake_discord.guild_message(
                "muted member", mention_bot=True, roles=(ROLE_MEMBER, ROLE_MUTED)
            ),
            fake_discord.guild_message(
                "blocked user", mention_bot=True, roles=(ROLE_MEMBER,), author=user(BOB, "bob")
            ),
            fake_discord.guild_message("member", mention_bot=True, roles=(ROLE_MEMBER,)),
        ):
            await fake_discord.say(data)
        [sent] = await fake_discord.wait_sent(1)
        assert [i.text for i in echo.inbox] == ["member"]
        assert sent.content == "echo member"
    finally:
        await transport.stop()


def test_discord_gets_a_bigger_budget_than_the_mesh() -> None:
    mesh = MeshtasticConfig()
    limits = build_discord(DiscordConfig(), env={}).limits
    assert (limits.context_tokens, limits.max_tokens) == (4096, 800)
    assert limits.context_tokens > mesh.context_tokens and limits.max_tokens > mesh.max_tokens
    custom = build_discord(DiscordConfig(context_tokens=16000, max_tokens=2000), env={}).limits
    assert (custom.context_tokens, custom.max_tokens) == (16000, 2000)


async def test_reply_to_bot_message_continues_without_mention(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    await fake_discord.say(fake_discord.guild_message("first", mention_bot=True))
    [bot_msg] = await fake_discord.wait_sent(1)
    await fake_discord.say(fake_discord.guild_message("and then?", reply_to=bot_msg))
    await fake_discord.wait_sent(2)
    assert [i.text for i in echo.inbox] == ["first", "and then?"]
    assert echo.inbox[1].reply_to == str(bot_msg.id)


async def test_reply_to_a_later_part_continues_the_whole_answer(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    """The responder stores an answer under its first message id; a reply to part 2 of it
    must name that id as its parent."""
    echo.answer = lambda i: Reply(inbound=i, text=("A long sentence here. " * 60) * 2)
    await fake_discord.say(fake_discord.dm_message("tell me a lot"))
    first, second = await fake_discord.wait_sent(2)
    await fake_discord.say(fake_discord.dm_message("about part two", reply_to=second))
    await fake_discord.wait_sent(4)
    assert echo.inbox[1].reply_to == str(first.id)


async def test_message_text_never_logged_at_info(
    fake_discord: FakeDiscord, echo: Echo, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await fake_discord.say(fake_discord.dm_message("my secret is zanzibar-omelette"))
    await fake_discord.wait_sent(1)
    await echo.wait_delivered(1)
    assert caplog.records
    leaks = [
        r for r in caplog.records if r.levelno >= logging.INFO and "zanzibar" in r.getMessage()
    ]
    assert leaks == []


async def test_same_message_twice_answered_once(fake_discord: FakeDiscord, echo: Echo) -> None:
    msg = fake_discord.dm_message("once")
    await fake_discord.say(msg)
    await fake_discord.say(msg)  # a gateway replay after a resume
    await fake_discord.say(fake_discord.dm_message("sentinel"))
    await fake_discord.wait_sent(2)
    assert [i.text for i in echo.inbox] == ["once", "sentinel"]


def long_code_answer() -> str:
    intro = "Here is the script you asked for. It reads the radio and logs packets. " * 12
    code = "\n".join(f"    packet_{i} = radio.receive(timeout={i})  # slot {i}" for i in range(80))
    return f"{intro}\n\n```python\n{code}\n```\n\n" + "Run it with python3. " * 40


async def test_five_thousand_char_answer_split_through_the_adapter(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    answer = long_code_answer()
    assert 5000 <= len(answer) <= 7000
    echo.answer = lambda i: Reply(inbound=i, text=answer, note="history trimmed")
    msg = await fake_discord.say(fake_discord.guild_message("script please", mention_bot=True))
    await fake_discord.say(
        fake_discord.guild_message("sentinel", mention_bot=True, author=user(BOB, "bob"))
    )
    sent = await fake_discord.wait_sent(5)
    parts = [s for s in sent if s.content != "echo sentinel" and s.payload.get("content")]
    # In order, the first a reply to the question, the rest plain follow-ups in the channel.
    contents = [s.content for s in parts[:4]]
    expected = split_message(echo.transport.fit(answer)) if echo.transport else []
    assert len(expected) == 4
    assert contents[:3] == expected[:3]
    assert contents[3] == expected[3] + "\n-# history trimmed"
    assert all(len(c) <= 2000 for c in contents)
    assert parts[0].reference_id == int(msg["id"])
    assert all(p.reference_id is None for p in parts[1:4])
    for c in contents:
        fences = [line for line in c.split("\n") if _fence_toggle(line) is not None]
        assert len(fences) % 2 == 0
    assert contents[1].startswith("```python\n")


async def test_export_attachments_go_to_the_person_by_dm(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    files = (Attachment("export.md", b"# you\n"), Attachment("export.json", b"{}"))
    echo.answer = lambda i: Reply(
        inbound=i, text="Your export is on its way privately.", kind=ReplyKind.COMMAND,
        attachments=files,
    )  # fmt: skip
    await fake_discord.say(fake_discord.guild_message("!export", mention_bot=True))
    reply, dm = await fake_discord.wait_sent(2)
    assert reply.channel_id == CHANNEL_ID and not reply.files
    assert dm.channel_id == fake_discord.dm_channel_id(ALICE)
    assert dm.files == [("export.md", b"# you\n"), ("export.json", b"{}")]
    assert fake_discord.dm_opened == [ALICE]
    assert await echo.wait_delivered(1) == [DeliveryStatus.DELIVERED]


async def test_closed_dms_reported_in_channel_and_delivery_failed(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    fake_discord.forbidden_channels.add(fake_discord.dm_channel_id(ALICE))
    echo.answer = lambda i: Reply(
        inbound=i, text="On its way.", kind=ReplyKind.COMMAND,
        attachments=(Attachment("export.md", b"x"),),
    )  # fmt: skip
    await fake_discord.say(fake_discord.guild_message("!export", mention_bot=True))
    reply, notice = await fake_discord.wait_sent(2)
    assert (reply.channel_id, reply.content) == (CHANNEL_ID, "On its way.")
    assert notice.channel_id == CHANNEL_ID
    assert "could not send you a DM" in notice.content
    assert await echo.wait_delivered(1) == [DeliveryStatus.FAILED]


async def test_answer_after_restart_rebuilds_the_reply_target(fake_discord: FakeDiscord) -> None:
    """A message stored before a restart is answered by a transport that never saw it."""
    echo = Echo()
    transport = await connect(fake_discord, echo)
    try:
        guild = Inbound(
            transport="discord", sender=str(ALICE), text="q", space=SPACE, message_id="1234"
        )
        dm = Inbound(transport="discord", sender=str(BOB), text="q", message_id="5678")
        assert (await transport.send(Reply(inbound=guild, text="late"))).status.value == "delivered"
        assert (await transport.send(Reply(inbound=dm, text="late too"))).status.value == (
            "delivered"
        )
        first, second = fake_discord.sent
        assert (first.channel_id, first.reference_id) == (CHANNEL_ID, 1234)
        assert (second.channel_id, second.reference_id) == (fake_discord.dm_channel_id(BOB), 5678)
    finally:
        await transport.stop()


async def test_send_never_raises_on_foreign_ids(fake_discord: FakeDiscord, echo: Echo) -> None:
    assert echo.transport is not None
    for inbound in (
        Inbound(transport="discord", sender="alice", text="q"),  # a DM to a non-Discord id
        Inbound(transport="discord", sender="1", text="q", space="channel-7"),
    ):
        delivery = await echo.transport.send(Reply(inbound=inbound, text="hi"))
        assert delivery.status is DeliveryStatus.FAILED and delivery.detail
    assert fake_discord.sent == []


# --- startup failures ---------------------------------------------------------------------
def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_missing_token_one_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    transport = build_discord(DiscordConfig(token_env="MY_BOT_TOKEN"), env={})
    await transport.start(Echo())
    await asyncio.wait_for(transport.wait_closed(), 1)
    [message] = errors(caplog)
    assert "MY_BOT_TOKEN" in message and "Fix:" in message
    delivery = await transport.send(Reply(inbound=Inbound("discord", "1", "x"), text="y"))
    assert delivery.status is DeliveryStatus.PENDING  # kept by the durable outbox


async def test_bad_token_one_clear_error(
    fake_discord: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    transport = build_discord(CONFIG, env={"DISCORD_TOKEN": "wrong"})
    await transport.start(Echo())
    await asyncio.wait_for(transport.wait_closed(), 5)
    [message] = errors(caplog)
    assert "rejected the token in DISCORD_TOKEN" in message and "Reset Token" in message
    assert fake_discord.logins == 1  # a rejected token is not retried


async def test_message_content_intent_missing_one_clear_error(
    fake_discord: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    fake_discord.close_code = 4014
    transport = build_discord(CONFIG, env={"DISCORD_TOKEN": TOKEN})
    await transport.start(Echo())
    await asyncio.wait_for(transport.wait_closed(), 5)
    [message] = errors(caplog)
    assert "MESSAGE CONTENT INTENT" in message
    assert fake_discord.identify is not None
    assert fake_discord.identify["intents"] & (1 << 15)  # we did ask for message content


async def test_intent_not_requested_when_disabled(fake_discord: FakeDiscord) -> None:
    echo = Echo()
    transport = await connect(fake_discord, echo, DiscordConfig(message_content_intent=False))
    await transport.stop()
    assert fake_discord.identify is not None
    assert not fake_discord.identify["intents"] & (1 << 15)


async def test_network_outage_at_startup_retried_with_backoff(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Discord unreachable (connection refused) for two attempts, then up."""
    server = FakeDiscord(port=free_port())
    server.patch(monkeypatch)
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == 2:
            await server.start()  # the network comes back

    transport = build_discord(
        DiscordConfig(retry_initial=2, retry_max=60),
        env={"DISCORD_TOKEN": TOKEN},
        sleep=sleep,
        rand=lambda: 0.0,
    )
    try:
        await transport.start(Echo())
        await asyncio.wait_for(server.ready.wait(), 5)
        assert delays == [1.0, 2.0]
        warnings = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "bot.transport.discord"
        ]
        assert len(warnings) == 2 and "retrying in" in warnings[0].getMessage()
        assert not errors(caplog)
    finally:
        await transport.stop()
        await server.stop()


async def test_stop_during_backoff_ends_promptly(monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakeDiscord(port=free_port())  # never started: Discord stays unreachable
    server.patch(monkeypatch)
    transport = build_discord(DiscordConfig(retry_initial=300), env={"DISCORD_TOKEN": TOKEN})
    await transport.start(Echo())
    await transport.stop()
    await asyncio.wait_for(transport.wait_closed(), 5)


async def test_mentions_reach_the_model_as_names(fake_discord: FakeDiscord, echo: Echo) -> None:
    content = f"ask <@{BOB}> and <@&{ROLE_MEMBER}> in <#{OTHER_CHANNEL_ID}> <:party:123456>"
    await fake_discord.say(
        fake_discord.guild_message(
            content,
            mention_bot=True,
            mentions=(user(BOB, "bob"),),
            mention_roles=(ROLE_MEMBER,),
        )
    )
    await fake_discord.wait_sent(1)
    [inbound] = echo.inbox
    assert inbound.text == "ask @Bob and @member in #general :party:"


async def test_text_attachments_are_read_images_named_with_a_note(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    """A long paste arrives as message.txt: the model reads it under its name. An image is
    named, not read, and the answer says so in its note line."""
    data = fake_discord.guild_message("look at this", mention_bot=True)
    big = fake_discord.attachment("huge.bin", b"\0" * 10, "application/octet-stream")
    data["attachments"] = [
        fake_discord.attachment("message.txt", "line one\r\nline two ü".encode(), "text/plain"),
        fake_discord.attachment("cat.png", b"\x89PNG....", "image/png"),
        fake_discord.attachment("notes.md", b"# title"),  # no content type: by extension
        big,
    ]
    await fake_discord.say(data)
    [sent] = await fake_discord.wait_sent(1)
    [inbound] = echo.inbox
    assert inbound.text == (
        "look at this\n\n[file: message.txt]\nline one\nline two ü\n\n[image: cat.png]"
        "\n\n[file: notes.md]\n# title\n\n[file: huge.bin]"
    )
    assert int(big["id"]) not in fake_discord.cdn_reads  # binary files are not downloaded
    assert sent.content.endswith(
        "\n-# images are not read (vision is off), only the text; only text files are read; "
        "huge.bin not read"
    )


async def test_attached_text_is_cut_to_max_message_chars(fake_discord: FakeDiscord) -> None:
    e = Echo()
    transport = build_discord(CONFIG, env={"DISCORD_TOKEN": TOKEN}, max_message_chars=100)
    e.transport = transport
    await transport.start(e)
    await asyncio.wait_for(fake_discord.ready.wait(), 5)
    try:
        data = fake_discord.dm_message("")
        data["attachments"] = [fake_discord.attachment("message.txt", b"x" * 5000, "text/plain")]
        await fake_discord.say(data)
        [sent] = await fake_discord.wait_sent(1)
        [inbound] = e.inbox
        assert inbound.text == "[file: message.txt]\n" + "x" * 100
        assert "I read only its beginning" in sent.content
    finally:
        await transport.stop()


async def test_a_sticker_alone_is_not_announced_as_empty(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    data = fake_discord.guild_message("", mention_bot=True)
    data["content"] = f"<@{BOT_ID}>"
    data["sticker_items"] = [{"id": "1", "name": "wave", "format_type": 1}]
    await fake_discord.say(data)
    await fake_discord.say(fake_discord.guild_message("sentinel", mention_bot=True))
    await fake_discord.wait_sent(1)
    assert [i.text for i in echo.inbox] == ["sentinel"]


async def test_reply_to_another_person_quotes_their_message(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    bobs = await fake_discord.say(
        fake_discord.guild_message("the relay on the hill is down", author=user(BOB, "bob"))
    )
    await fake_discord.say(
        fake_discord.guild_message("is that true?", mention_bot=True, reply_to=bobs)
    )
    await fake_discord.wait_sent(1)
    [inbound] = echo.inbox
    assert inbound.text == (
        f"(replying to Bob (id {BOB}):)\n> the relay on the hill is down\n\nis that true?"
    )
    assert inbound.reply_to == bobs["id"]


async def test_reply_to_the_answer_for_someone_else_quotes_it_but_not_your_own(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    await fake_discord.say(
        fake_discord.guild_message("what is LoRa?", mention_bot=True, author=user(BOB, "bob"))
    )
    [answer] = await fake_discord.wait_sent(1)
    # Alice continues from the answer Bob got: it comes along as a quote.
    await fake_discord.say(fake_discord.guild_message("and its range?", reply_to=answer))
    await fake_discord.wait_sent(2)
    assert echo.inbox[1].text == ("(replying to Meshsage:)\n> echo what is LoRa?\n\nand its range?")
    # Bob replying to his own answer needs no quote: it is in his conversation already.
    await fake_discord.say(
        fake_discord.guild_message("thanks", reply_to=answer, author=user(BOB, "bob"))
    )
    await fake_discord.wait_sent(3)
    assert echo.inbox[2].text == "thanks"
    assert echo.inbox[2].reply_to == str(answer.id)


def _export_reply(*files: Attachment) -> Callable[[Inbound], Reply]:
    return lambda i: Reply(
        inbound=i, text="Your export is on its way.", kind=ReplyKind.COMMAND, attachments=files
    )


async def test_export_over_the_upload_limit_is_compressed_or_split(
    fake_discord: FakeDiscord,
) -> None:
    import gzip
    import random as rnd

    limit = 64 * 1024
    fake_discord.upload_limit = limit
    noise = rnd.Random(7).randbytes(150_000)  # does not compress: split in pieces
    text = b"you said hello\n" * 20_000  # 300 kB that compresses well
    e = Echo()
    e.answer = _export_reply(Attachment("export.md", text), Attachment("export.json", noise))
    config = DiscordConfig(channels=(CHANNEL_ID,), upload_limit=limit)
    transport = await connect(fake_discord, e, config)
    try:
        await fake_discord.say(fake_discord.dm_message("!export"))
        assert await e.wait_delivered(1) == [DeliveryStatus.DELIVERED]
        uploads = [f for s in fake_discord.sent for f in s.files]
        names = [n for n, _ in uploads]
        assert names[0] == "export.md.gz"
        assert gzip.decompress(uploads[0][1]) == text
        pieces = [b for n, b in uploads if n.startswith("export.json.gz.part")]
        assert len(pieces) >= 3 and names[-1].endswith(f"of{len(pieces)}")
        assert gzip.decompress(b"".join(pieces)) == noise
        assert all(sum(len(b) for _, b in s.files) <= limit for s in fake_discord.sent)
        notes = [s.content for s in fake_discord.sent if s.files and s.content]
        assert notes and "cat export.json.gz.part*" in notes[0]
    finally:
        await transport.stop()


async def test_export_that_cannot_be_uploaded_is_reported_truthfully(
    fake_discord: FakeDiscord, echo: Echo
) -> None:
    fake_discord.upload_limit = 10  # Discord refuses even small files (say, a lower limit)
    echo.answer = _export_reply(Attachment("export.md", b"x" * 100))
    await fake_discord.say(fake_discord.guild_message("!export", mention_bot=True))
    reply, notice = await fake_discord.wait_sent(2)
    assert reply.content == "Your export is on its way."
    assert notice.channel_id == CHANNEL_ID
    assert notice.content.startswith("Sorry, I could not send your files after all")
    assert "HTTP 413" in notice.content
    assert await echo.wait_delivered(1) == [DeliveryStatus.FAILED]


# --- catch-up: what was said while the bot was away ---------------------------------------
class Stored:
    """Stands in for the store's platform-id lookup: what the Echo responder has received."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    async def __call__(self, ids: object, since: float) -> set[str]:
        assert isinstance(ids, list)
        return self.ids & set(ids)


async def start_with_catch_up(
    fake_discord: FakeDiscord, tmp_path: object, stored: Stored, echo: Echo | None = None
) -> tuple[DiscordTransport, Echo]:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    e = echo or Echo()
    inner = e.__call__

    async def record(inbound: Inbound) -> None:
        stored.ids.add(inbound.message_id or "")
        await inner(inbound)

    def quick_ready(intents: discord.Intents) -> discord.Client:
        # discord.py waits guild_ready_timeout (2 s) for more guilds before on_ready.
        return discord.Client(
            intents=intents, allowed_mentions=NO_MENTIONS, guild_ready_timeout=0.05
        )

    transport = build_discord(
        CONFIG,
        env={"DISCORD_TOKEN": TOKEN},
        client_factory=quick_ready,
        seen_path=tmp_path / "discord-seen.json",
        known=stored,
    )
    e.transport = transport
    await transport.start(record)
    await asyncio.wait_for(fake_discord.ready.wait(), 5)
    # on_ready has run (catch-up done): stopping earlier would leave discord.py's delayed
    # on_ready to fire into a closed client.
    await asyncio.wait_for(transport.caught_up.wait(), 10)
    return transport, e


async def test_messages_sent_while_stopped_are_answered_once_after_start(
    fake_discord: FakeDiscord, tmp_path: object
) -> None:
    stored = Stored()
    first, _ = await start_with_catch_up(fake_discord, tmp_path, stored)
    await fake_discord.say(fake_discord.dm_message("before the restart"))
    await fake_discord.wait_sent(1)
    await first.stop()

    say = fake_discord.post_offline
    say(fake_discord.guild_message("chatter, not for the bot"))
    say(fake_discord.guild_message("asked while you were away", mention_bot=True))
    say(fake_discord.dm_message("a DM while you were away"))
    say(
        fake_discord.guild_message(
            "not allowed here", mention_bot=True, channel_id=OTHER_CHANNEL_ID
        )
    )

    fake_discord.ready.clear()
    second, e2 = await start_with_catch_up(fake_discord, tmp_path, stored)
    try:
        sent = await fake_discord.wait_sent(3)
        await fake_discord.say(fake_discord.dm_message("sentinel after catch-up"))
        sent = await fake_discord.wait_sent(4)
        assert [i.text for i in e2.inbox] == [
            "asked while you were away",
            "a DM while you were away",
            "sentinel after catch-up",
        ]
        assert [s.content for s in sent[1:]] == [
            "echo asked while you were away",
            "echo a DM while you were away",
            "echo sentinel after catch-up",
        ]
        # Each reply goes to the message it answers, in its own channel.
        assert sent[1].channel_id == CHANNEL_ID
        assert sent[2].channel_id == fake_discord.dm_channel_id(ALICE)
    finally:
        await second.stop()

    # A third start finds nothing new: the marks and the store both say so.
    fake_discord.ready.clear()
    third, e3 = await start_with_catch_up(fake_discord, tmp_path, stored)
    try:
        await asyncio.wait_for(third.caught_up.wait(), 5)
        await fake_discord.say(fake_discord.dm_message("last"))
        await fake_discord.wait_sent(5)
        assert [i.text for i in e3.inbox] == ["last"]
    finally:
        await third.stop()


async def test_store_dedup_without_marks(fake_discord: FakeDiscord, tmp_path: object) -> None:
    """Marks lost (file deleted): what is stored is still not answered twice."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    stored = Stored()
    first, _ = await start_with_catch_up(fake_discord, tmp_path, stored)
    await fake_discord.say(fake_discord.guild_message("asked once", mention_bot=True))
    await fake_discord.wait_sent(1)
    await first.stop()
    (tmp_path / "discord-seen.json").unlink()
    fake_discord.ready.clear()
    second, e2 = await start_with_catch_up(fake_discord, tmp_path, stored)
    try:
        await asyncio.wait_for(second.caught_up.wait(), 5)
        await fake_discord.say(fake_discord.guild_message("sentinel", mention_bot=True))
        await fake_discord.wait_sent(2)
        assert [i.text for i in e2.inbox] == ["sentinel"]
        assert fake_discord.history_reads  # it did look
    finally:
        await second.stop()


async def test_reconnect_that_cannot_resume_reads_history(
    fake_discord: FakeDiscord, tmp_path: object
) -> None:
    stored = Stored()
    transport, e = await start_with_catch_up(fake_discord, tmp_path, stored)
    try:
        await fake_discord.say(fake_discord.guild_message("before the blip", mention_bot=True))
        await fake_discord.wait_sent(1)
        fake_discord.resumable = False
        await fake_discord.disconnect()
        await fake_discord.say(fake_discord.guild_message("during the blip", mention_bot=True))
        sent = await fake_discord.wait_sent(2, timeout=30)
        assert fake_discord.sessions == 2
        assert sent[1].content == "echo during the blip"
        await fake_discord.say(fake_discord.guild_message("sentinel", mention_bot=True))
        await fake_discord.wait_sent(3)
        assert [i.text for i in e.inbox] == ["before the blip", "during the blip", "sentinel"]
    finally:
        await transport.stop()


async def test_resumed_session_replays_without_reading_history(
    fake_discord: FakeDiscord, tmp_path: object
) -> None:
    stored = Stored()
    transport, e = await start_with_catch_up(fake_discord, tmp_path, stored)
    try:
        await fake_discord.say(fake_discord.guild_message("before the blip", mention_bot=True))
        await fake_discord.wait_sent(1)
        reads = len(fake_discord.history_reads)
        await fake_discord.disconnect()
        await fake_discord.say(fake_discord.guild_message("during the blip", mention_bot=True))
        await fake_discord.wait_sent(2, timeout=30)
        await fake_discord.say(fake_discord.guild_message("sentinel", mention_bot=True))
        await fake_discord.wait_sent(3)
        assert [i.text for i in e.inbox] == ["before the blip", "during the blip", "sentinel"]
        assert fake_discord.sessions == 1
        assert len(fake_discord.history_reads) == reads
    finally:
        await transport.stop()


# --- streamed answers ----------------------------------------------------------------------
class ManualClock:
    """The transport's clock; ``sleep`` moves it on at once."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


async def stream_words(
    fake_discord: FakeDiscord, text: str, *, interval: float, step: float
) -> tuple[list[Sent], list[float], Inbound]:
    """A transport with streaming on: the answer ``text`` arrives word by word, ``step``
    seconds apart on the fake clock; returns the bot's posts and when each post/edit was."""
    clock = ManualClock()
    fake_discord.clock = clock
    config = DiscordConfig(channels=(CHANNEL_ID,), stream_edit_seconds=interval)
    transport = build_discord(config, env={"DISCORD_TOKEN": TOKEN}, clock=clock, sleep=clock.sleep)
    done = asyncio.Event()
    got: list[Inbound] = []
    post_times: list[float] = []

    async def respond(inbound: Inbound) -> None:
        got.append(inbound)
        stream = transport.stream(inbound)
        assert stream is not None
        words = text.split(" ")
        for i in range(1, len(words) + 1):
            before = len(fake_discord.sent)
            await stream.update(" ".join(words[:i]))
            post_times.extend(clock.now for _ in fake_discord.sent[before:])
            clock.now += step
        before = len(fake_discord.sent)
        delivery = await stream.finish(Reply(inbound=inbound, text=transport.fit(text)))
        post_times.extend(clock.now for _ in fake_discord.sent[before:])
        assert delivery.status == DeliveryStatus.DELIVERED
        assert list(delivery.message_ids) == [str(s.id) for s in fake_discord.sent]
        done.set()

    await transport.start(respond)
    await asyncio.wait_for(fake_discord.ready.wait(), 5)
    try:
        await fake_discord.say(fake_discord.guild_message("tell me", mention_bot=True))
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await transport.stop()
    # One update is one round (an edit of the growing part, perhaps a post of the next one):
    # the rounds are what the rate applies to.
    times = sorted(set(post_times + [t for t, _, _ in fake_discord.edits]))
    return fake_discord.sent, times, got[0]


async def test_streamed_answer_grows_by_edits_at_the_configured_rate(
    fake_discord: FakeDiscord,
) -> None:
    text = " ".join(f"word{i}" for i in range(60))
    sent, times, inbound = await stream_words(fake_discord, text, interval=1.5, step=0.2)
    [answer] = sent
    assert answer.content == text
    assert answer.reference_id == int(inbound.message_id or 0)
    assert len(fake_discord.edits) >= 5  # it did grow, in several steps
    assert len(fake_discord.edits) <= 60 * 0.2 / 1.5 + 2  # not once per word
    assert all(b - a >= 1.5 for a, b in itertools.pairwise(times))
    assert fake_discord.rate_limited == 0
    assert [c for _, _, c in fake_discord.edits][-1] == text


async def test_streamed_answer_continues_in_a_new_message_past_2000_chars(
    fake_discord: FakeDiscord,
) -> None:
    text = " ".join(f"sentence{i:03d}." for i in range(400))  # about 5,200 characters
    sent, times, _ = await stream_words(fake_discord, text, interval=1.0, step=0.5)
    final = split_message(DiscordTransport(config=CONFIG, token=None).fit(text))
    assert [s.content for s in sent] == final
    assert len(final) == 3
    assert sent[0].reference_id is not None and sent[1].reference_id is None
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times))
    assert fake_discord.rate_limited == 0


async def test_aborted_stream_removes_the_partial_answer(fake_discord: FakeDiscord) -> None:
    """The LLM failed after the first words: what was shown is deleted (the notice follows)."""
    clock = ManualClock()
    transport = build_discord(CONFIG, env={"DISCORD_TOKEN": TOKEN}, clock=clock, sleep=clock.sleep)
    done = asyncio.Event()

    async def respond(inbound: Inbound) -> None:
        stream = transport.stream(inbound)
        assert stream is not None
        await stream.update("The answer beg")
        await stream.abort()
        done.set()

    await transport.start(respond)
    await asyncio.wait_for(fake_discord.ready.wait(), 5)
    try:
        await fake_discord.say(fake_discord.dm_message("hello"))
        await asyncio.wait_for(done.wait(), 5)
        [partial] = fake_discord.sent
        assert partial.content == "The answer beg"
        assert fake_discord.deleted == [partial.id]
    finally:
        await transport.stop()
