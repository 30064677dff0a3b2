"""Discord wired into the whole app: the real responder, memory and commands, the fake LLM
over HTTP, and discord.py talking to the loopback Discord (tests/fakes/fake_discord.py)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.answering import unavailable_notice
from bot.app import App, build
from bot.config import Config, MeshtasticConfig, load_config
from bot.domain import DM_SPACE, ConversationKey
from bot.errors import MeshsageError
from bot.memory.store import SqliteStore, StoredMessage
from bot.responder import TRIMMED_NOTE
from bot.transports.discord import STYLE_HINT, build_discord
from tests.conftest import make_config
from tests.fakes.fake_discord import (
    ALICE,
    BOB,
    CHANNEL_ID,
    GUILD_ID,
    TOKEN,
    FakeDiscord,
    Json,
    Sent,
    user,
)
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

SITE = Path(__file__).parent / "fakes" / "discord_site"
CHANNEL_SPACE = f"guild:{GUILD_ID}:ch:{CHANNEL_ID}"


@dataclass
class Rig:
    """The running app with Discord (and any extra transports) attached."""

    app: App
    discord: FakeDiscord
    llm: FakeLLM

    async def exchange(self, data: Json) -> Sent:
        """Send one Discord message, wait until its turn is done, return the bot's first post."""
        before = len(self.discord.sent)
        await self.discord.say(data)
        sent = await self.discord.wait_sent(before + 1)
        await self.app.responder.wait_idle()
        return sent[before]

    def prompt(self) -> str:
        """Everything the LLM was shown in the last chat request."""
        return "\n".join(m["content"] for m in self.llm.chat_requests()[-1]["messages"])

    async def stored(self, space: str, person: int = ALICE) -> list[StoredMessage]:
        conv = await self.app.store.find_conversation(
            ConversationKey("discord", str(person), space)
        )
        assert conv is not None, space
        return await self.app.store.all_messages(conv.id)


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path,
    llm: FakeLLM,
    fake_discord: FakeDiscord,
    *others: FakeTransport,
    discord_keys: str = "",
    sections: str = "",
    seen: Path | None = None,
) -> AsyncIterator[Rig]:
    """``discord_keys``: more lines under ``discord:``; ``sections``: more top-level YAML."""
    if "stream_edit_seconds" not in discord_keys:  # streaming on, but quick between edits
        discord_keys += "  stream_edit_seconds: 0.2\n"
    config = make_config(
        tmp_path, llm.base_url, f"discord:\n  channels: [{CHANNEL_ID}]\n{discord_keys}{sections}"
    )
    assert config.discord is not None
    discord_transport = build_discord(
        config.discord, env={"DISCORD_TOKEN": TOKEN}, seen_path=seen
    )  # ``seen``: catch-up marks kept across runs
    app = await build(config, env={}, transports=[discord_transport, *others])
    await app.start()
    try:
        await asyncio.wait_for(fake_discord.ready.wait(), 30)
        yield Rig(app, fake_discord, llm)
    finally:
        await app.close()


async def started_caught_up(config: Config, fake_discord: FakeDiscord) -> App:
    """A started app on the loopback Discord, once it is ready and has caught up with what
    was said while it was down (a restart)."""
    fake_discord.ready.clear()
    app = await build(config, env={"DISCORD_TOKEN": TOKEN})
    await app.start()
    await asyncio.wait_for(fake_discord.ready.wait(), 30)
    [transport] = app.transports
    await asyncio.wait_for(transport.caught_up.wait(), 30)  # type: ignore[attr-defined]
    await app.responder.wait_idle()
    return app


async def test_dm_content_never_reaches_a_channel_reply(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(fake_discord.dm_message("my locker code is PINEAPPLE42"))
        answer = await rig.exchange(
            fake_discord.guild_message("what is my locker code?", mention_bot=True)
        )
        assert answer.content == "Hello from fake"
        assert "PINEAPPLE42" not in rig.prompt()
        # The same question in the DM does use the DM's memory: the check above can fail.
        await rig.exchange(fake_discord.dm_message("what is my locker code?"))
        assert "PINEAPPLE42" in rig.prompt()
        texts = [m.text for m in await rig.stored(CHANNEL_SPACE)]
        assert texts == ["what is my locker code?", "Hello from fake"]


async def test_discord_budget_and_style_reach_the_llm(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(fake_discord.dm_message("hello"))
        [request] = fake_llm.chat_requests()
        assert request["max_tokens"] == 800 > MeshtasticConfig().max_tokens
        assert STYLE_HINT in request["messages"][0]["content"]


async def test_reset_on_discord_leaves_mesh_conversation(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    mesh = FakeTransport(name="meshtastic")
    person = str(ALICE)  # the same id on both transports: only the transport tells them apart
    async with running(tmp_path, fake_llm, fake_discord, mesh) as rig:
        await mesh.say("my radio is a T-Beam", sender=person)
        await rig.app.responder.wait_idle()
        await rig.exchange(fake_discord.dm_message("my bike is red"))
        reset = await rig.exchange(fake_discord.dm_message("!reset"))
        assert reset.content.startswith("Fresh start")

        await rig.exchange(fake_discord.dm_message("what colour is my bike?"))
        assert "my bike is red" not in rig.prompt()
        await mesh.say("which radio do I have?", sender=person)
        await rig.app.responder.wait_idle()
        assert "my radio is a T-Beam" in rig.prompt()


async def test_export_sends_the_persons_conversations_by_dm(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(fake_discord.dm_message("my cat is called Miso"))
        await rig.exchange(fake_discord.guild_message("the channel needs a bot", mention_bot=True))
        bob = user(BOB, "bob")
        await rig.exchange(
            fake_discord.guild_message("bob's secret is TURNIP", mention_bot=True, author=bob)
        )
        ask = fake_discord.guild_message("!export", mention_bot=True)
        before = len(fake_discord.sent)
        await fake_discord.say(ask)
        notice, files = (await fake_discord.wait_sent(before + 2))[before:]
        await rig.app.responder.wait_idle()

        # In the channel: a short reply saying where the export went, nothing of its content.
        assert notice.channel_id == CHANNEL_ID and notice.reference_id == int(ask["id"])
        assert "privately" in notice.content and not notice.files
        assert "Miso" not in notice.content
        # By DM to the person who asked: Markdown and JSON of their own conversations only.
        assert files.channel_id == fake_discord.dm_channel_id(ALICE)
        named = dict(files.files)
        assert sorted(named) == ["meshsage-export-discord.json", "meshsage-export-discord.md"]
        markdown = named["meshsage-export-discord.md"].decode()
        assert markdown.startswith(f"# meshsage export for {ALICE} (discord)")
        assert "## Space: dm" in markdown and f"## Space: {CHANNEL_SPACE}" in markdown
        assert "my cat is called Miso" in markdown and "the channel needs a bot" in markdown
        assert "TURNIP" not in markdown
        doc = json.loads(named["meshsage-export-discord.json"])
        assert (doc["transport"], doc["person"]) == ("discord", str(ALICE))
        spaces = {c["space"]: [m["text"] for m in c["messages"]] for c in doc["conversations"]}
        assert spaces == {
            DM_SPACE: ["my cat is called Miso", "Hello from fake"],
            CHANNEL_SPACE: ["the channel needs a bot", "Hello from fake"],
        }


async def test_llm_unavailable_is_said_briefly_as_a_reply(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    fake_llm.script = [("status", 503, {"error": {"message": "model is loading"}})]
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        question = fake_discord.dm_message("are you there?")
        notice = await rig.exchange(question)
        assert notice.content == unavailable_notice(fake_llm.base_url)
        assert notice.reference_id == int(question["id"])
        [stored] = await rig.stored(DM_SPACE)  # the notice is not something the model said
        assert (stored.text, stored.status) == ("are you there?", "failed")


async def test_trimmed_message_noted_in_one_small_line(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    sections = "bot:\n  max_message_chars: 100\n"
    async with running(tmp_path, fake_llm, fake_discord, sections=sections) as rig:
        answer = await rig.exchange(fake_discord.dm_message("long message. " * 30))
        assert answer.content == f"Hello from fake\n-# {TRIMMED_NOTE}"
        stored = await rig.stored(DM_SPACE)
        assert [m.text for m in stored][1:] == ["Hello from fake"]  # the note is not the answer


async def test_reply_to_any_part_of_an_answer_stores_the_answer_as_parent(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    fake_llm.reply = "A long sentence here. " * 120  # two Discord messages
    async with running(tmp_path, fake_llm, fake_discord) as rig:
        await rig.exchange(fake_discord.guild_message("tell me a lot", mention_bot=True))
        first, second = fake_discord.sent
        fake_llm.reply = "short"
        await rig.exchange(fake_discord.guild_message("part two?", reply_to=second))
        await rig.exchange(fake_discord.guild_message("part one?", reply_to=first))
        question, answer, reply2, _, reply1, _ = await rig.stored(CHANNEL_SPACE)
        assert (answer.role, answer.platform_id) == ("assistant", str(first.id))
        assert answer.parent_id == question.id
        assert (reply2.text, reply2.parent_id) == ("part two?", answer.id)
        assert (reply1.text, reply1.parent_id) == ("part one?", answer.id)


# --- the thread being answered ------------------------------------------------------------
CODEWORD_QUESTION = "pick a codeword"
CODEWORD = "MARMALADE"
FILLERS = 14
# A small budget so the codeword's turn leaves the recent window; no summaries (a summary could
# carry the codeword back in); no rate limit for the fillers.
SMALL = "bot:\n  rate_limit:\n    messages: 1000\nmemory:\n  summary:\n    enabled: false\n"


def codeword_llm(body: dict[str, Any]) -> str:
    last = body["messages"][-1]["content"]
    return f"The codeword is {CODEWORD}." if last.endswith(CODEWORD_QUESTION) else "ok"


@contextlib.asynccontextmanager
async def codeword_then_fillers(
    tmp_path: Path, llm: FakeLLM, fake_discord: FakeDiscord
) -> AsyncIterator[tuple[Rig, Sent]]:
    """The bot names a codeword in the channel, then many unrelated turns push it out of a
    small (300-token) window."""
    llm.reply_fn = codeword_llm
    mention = fake_discord.guild_message
    keys = "  context_tokens: 300\n"
    async with running(tmp_path, llm, fake_discord, discord_keys=keys, sections=SMALL) as rig:
        codeword = await rig.exchange(mention(CODEWORD_QUESTION, mention_bot=True))
        assert CODEWORD in codeword.content
        for i in range(FILLERS):
            await rig.exchange(mention(f"filler note {i} about garden hoses", mention_bot=True))
        yield rig, codeword


async def test_thread_parent_out_of_the_window_is_stored_but_not_found_by_words(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    """The setting of the test below: only a thread preference can bring the codeword back."""
    async with codeword_then_fillers(tmp_path, fake_llm, fake_discord) as (rig, codeword):
        await rig.exchange(fake_discord.guild_message("explain please", mention_bot=True))
        assert CODEWORD not in rig.prompt()  # out of the window; retrieval finds no words
        await rig.exchange(fake_discord.guild_message("explain that", reply_to=codeword))
        stored = await rig.stored(CHANNEL_SPACE)
        [answer] = [m for m in stored if CODEWORD in m.text]
        assert stored[-2].text == "explain that" and stored[-2].parent_id == answer.id


async def test_reply_brings_the_thread_it_answers_into_the_prompt(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with codeword_then_fillers(tmp_path, fake_llm, fake_discord) as (rig, codeword):
        await rig.exchange(fake_discord.guild_message("explain that", reply_to=codeword))
        assert CODEWORD in rig.prompt()
        assert CODEWORD_QUESTION in rig.prompt()


# --- startup failures and the whole program -----------------------------------------------
STARTUP_FAILURES = {
    "missing token": ({}, None, "the environment variable DISCORD_TOKEN is empty or not set"),
    "bad token": ({"DISCORD_TOKEN": "wrong"}, None, "Discord rejected the token"),
    "intent not enabled": ({"DISCORD_TOKEN": TOKEN}, 4014, "MESSAGE CONTENT INTENT"),
}


@pytest.mark.parametrize("case", list(STARTUP_FAILURES))
async def test_discord_failing_at_startup_leaves_the_console_running(
    tmp_path: Path,
    fake_llm: FakeLLM,
    fake_discord: FakeDiscord,
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    env, close_code, needle = STARTUP_FAILURES[case]
    fake_discord.close_code = close_code
    fake_llm.reply = "console answer"
    config = make_config(tmp_path, fake_llm.base_url, "console:\n  user: alice\ndiscord:\n")
    read_fd, write_fd = os.pipe()
    out = io.StringIO()
    with os.fdopen(read_fd, "rb") as stdin:
        app = await build(config, env=env, stdin=stdin, stdout=out)
        [discord_transport] = [t for t in app.transports if t.name == "discord"]
        run = asyncio.create_task(app.run(asyncio.Event()))
        try:
            await asyncio.wait_for(discord_transport.wait_closed(), 30)
            os.write(write_fd, b"hello\n")  # the console is asked only after Discord gave up
        finally:
            os.close(write_fd)
            await asyncio.wait_for(run, 60)  # ends at the console's EOF
    assert "console answer" in out.getvalue()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and needle in errors[0] and "Other transports keep running" in errors[0]


async def test_meshsage_run_serves_console_and_discord_on_one_database(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"llm:\n  base_url: {fake_llm.base_url}\n  model: fake\n  retries: 0\n"
        f"console:\n  user: alice\n"
        f"discord:\n  channels: [{CHANNEL_ID}]\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHSAGE_", "DISCORD_"))}
    env.update(
        DISCORD_TOKEN=TOKEN,
        FAKE_DISCORD_PORT=str(fake_discord.port),
        PYTHONPATH=os.pathsep.join([str(SITE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        TIKTOKEN_CACHE_DIR="",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", "--config", str(cfg),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"hello from the terminal\n")
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.decode().strip() == "Hello from fake"
        await asyncio.wait_for(fake_discord.ready.wait(), 60)
        await fake_discord.say(fake_discord.dm_message("hello from Discord"))
        [sent] = await fake_discord.wait_sent(1, timeout=60)
        await fake_discord.wait_content(sent, "Hello from fake", timeout=60)  # streamed
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "stopped cleanly" in err.decode()

    config = load_config(cfg, env={})
    store = await SqliteStore.open(config.database_path)
    try:
        for key, text in [
            (ConversationKey("console", "alice", DM_SPACE), "hello from the terminal"),
            (ConversationKey("discord", str(ALICE), DM_SPACE), "hello from Discord"),
        ]:
            conv = await store.find_conversation(key)
            assert conv is not None, key
            texts = [m.text for m in await store.all_messages(conv.id)]
            assert texts == [text, "Hello from fake"]
    finally:
        await store.close()


async def test_discord_section_without_discord_py_says_how_to_install(
    tmp_path: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "discord", None)  # as if discord.py were not installed
    monkeypatch.delitem(sys.modules, "bot.transports.discord", raising=False)
    config = make_config(tmp_path, fake_llm.base_url, "discord:\n")
    with pytest.raises(MeshsageError, match=r"pip install 'meshsage\[discord\]'"):
        await build(config, env={})


async def test_messages_sent_while_stopped_are_answered_once_after_start(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real wiring: catch-up marks in the state directory, dedup by the store."""
    import discord

    from bot.transports import discord as transport_module

    def quick_ready(intents: discord.Intents) -> discord.Client:
        # discord.py waits guild_ready_timeout (2 s) for more guilds before on_ready.
        return discord.Client(
            intents=intents, allowed_mentions=transport_module.NO_MENTIONS, guild_ready_timeout=0.05
        )

    monkeypatch.setattr(transport_module, "default_client", quick_ready)
    config = make_config(  # streaming on, but quick between edits (as ``running``)
        tmp_path,
        fake_llm.base_url,
        f"discord:\n  channels: [{CHANNEL_ID}]\n  stream_edit_seconds: 0.2\n",
    )

    app = await started_caught_up(config, fake_discord)
    try:
        before = len(fake_discord.sent)
        await fake_discord.say(fake_discord.dm_message("hello before"))
        await fake_discord.wait_sent(before + 1)
        await app.responder.wait_idle()
    finally:
        await app.close()
    fake_discord.post_offline(fake_discord.dm_message("sent while stopped"))
    fake_discord.post_offline(fake_discord.guild_message("also while stopped", mention_bot=True))
    for _ in range(2):  # a second start answers nothing again
        app = await started_caught_up(config, fake_discord)
        await app.close()
    answered = [s for s in fake_discord.sent if s.content == "Hello from fake"]
    assert len(answered) == 3
    store = await SqliteStore.open(config.database_path)
    try:
        dm = await store.find_conversation(ConversationKey("discord", str(ALICE), DM_SPACE))
        assert dm is not None
        texts = [m.text for m in await store.all_messages(dm.id)]
        assert texts == ["hello before", "Hello from fake", "sent while stopped", "Hello from fake"]
    finally:
        await store.close()


async def test_streamed_answer_is_stored_as_its_final_text(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    fake_llm.reply = "LoRa is a long range radio modulation used by Meshtastic nodes."
    keys = "  stream_edit_seconds: 0.2\n"
    async with running(tmp_path, fake_llm, fake_discord, discord_keys=keys) as rig:
        sent = await rig.exchange(fake_discord.dm_message("what is LoRa?"))
        assert fake_llm.chat_requests()[-1]["stream"] is True
        assert sent.content == fake_llm.reply
        _question, answer = await rig.stored(DM_SPACE)
        assert (answer.text, answer.platform_id) == (fake_llm.reply, str(sent.id))
        assert answer.status == "delivered"


async def test_stream_off_sends_one_message(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    async with running(tmp_path, fake_llm, fake_discord, discord_keys="  stream: false\n") as rig:
        sent = await rig.exchange(fake_discord.dm_message("hello"))
        assert sent.content == "Hello from fake" and not fake_discord.edits


async def test_images_reach_a_vision_model_as_image_parts(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    import base64

    config = make_config(
        tmp_path,
        fake_llm.base_url,
        f"  vision: true\ndiscord:\n  channels: [{CHANNEL_ID}]\n  stream: false\n",
    )
    assert config.discord is not None and config.llm.vision
    chat = build_discord(config.discord, env={"DISCORD_TOKEN": TOKEN}, vision=True)
    app = await build(config, env={}, transports=[chat])
    await app.start()
    try:
        await asyncio.wait_for(fake_discord.ready.wait(), 30)
        png = b"\x89PNG\r\n\x1a\nfake image bytes"
        data = fake_discord.dm_message("what is in this picture?")
        data["attachments"] = [fake_discord.attachment("cat.png", png, "image/png")]
        await fake_discord.say(data)
        [sent] = await fake_discord.wait_sent(1)
        await app.responder.wait_idle()
        last = fake_llm.chat_requests()[-1]["messages"][-1]
        # (after the date line a day's first message opens with)
        assert last["content"][0]["type"] == "text"
        assert last["content"][0]["text"].split("\n", 1)[1] == (
            "what is in this picture?\n\n[image: cat.png]"
        )
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        assert last["content"][1] == {"type": "image_url", "image_url": {"url": url}}
        assert "images are not read" not in sent.content
        conv = await app.store.find_conversation(ConversationKey("discord", str(ALICE)))
        assert conv is not None
        stored = [m.text for m in await app.store.all_messages(conv.id)]
        assert stored[0] == "what is in this picture?\n\n[image: cat.png]"  # no image bytes
    finally:
        await app.close()


@pytest.mark.parametrize("stream", [True, False])
async def test_reply_to_a_later_part_after_a_restart_finds_the_answer(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord, stream: bool
) -> None:
    """Every part's platform id is stored: a transport that never saw the answer (restart)
    still threads a reply to part 2 under it."""
    fake_llm.reply = "A long sentence here. " * 120  # two Discord messages
    keys = f"  stream: {str(stream).lower()}\n"
    async with running(tmp_path, fake_llm, fake_discord, discord_keys=keys) as rig:
        await rig.exchange(fake_discord.guild_message("tell me a lot", mention_bot=True))
        await rig.app.responder.wait_idle()
        first, second = fake_discord.sent
    fake_llm.reply = "short"
    fake_discord.ready.clear()
    async with running(tmp_path, fake_llm, fake_discord, discord_keys=keys) as rig:
        await rig.exchange(fake_discord.guild_message("part two?", reply_to=second))
        _question, answer, reply2, _ = await rig.stored(CHANNEL_SPACE)
        assert answer.platform_id == str(first.id)
        assert reply2.parent_id == answer.id
        # After a restart the transport no longer knows whom that answer was for, so it
        # quotes it (the safe side: the text is visible in the channel anyway).
        assert reply2.text.endswith("\n\npart two?")


async def test_an_answer_discord_could_not_take_is_delivered_once_later(
    tmp_path: Path, fake_llm: FakeLLM, fake_discord: FakeDiscord
) -> None:
    """Issue 10: an answer produced while Discord cannot be reached stays in the outbox and is
    posted once when it can (it used to be stored as failed and never posted)."""
    async with running(tmp_path, fake_llm, fake_discord, discord_keys="  stream: false\n") as rig:
        fake_discord.drop_posts = 100  # every post dies on the wire for now
        await fake_discord.say(fake_discord.dm_message("are you there?"))
        for _ in range(500):  # until the answer has been tried (the gateway event is async)
            if fake_discord.drop_posts < 100 and rig.app.responder.idle:
                break
            await asyncio.sleep(0.01)
        await rig.app.responder.wait_idle()
        assert fake_discord.sent == []
        assert len(await rig.app.store.undelivered(transports=("discord",))) == 1
        fake_discord.drop_posts = 0  # reachable again: the next outbox round sends it
        assert await rig.app.responder.redeliver() == 1
        await rig.app.responder.wait_idle()
        assert [s.content for s in fake_discord.sent] == ["Hello from fake"]
        assert await rig.app.responder.redeliver() == 0  # delivered: never twice
        await rig.app.responder.wait_idle()
        assert len(fake_discord.sent) == 1
        assert await rig.app.store.undelivered(transports=("discord",)) == []
        assert len(fake_llm.chat_requests()) == 1  # the answer was not asked for again
