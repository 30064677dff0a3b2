"""Discord wired into the whole app: the real responder, memory and commands, the fake LLM
over HTTP, and discord.py talking to the loopback Discord (tests/fakes/fake_discord.py)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import App, build
from bot.config import load_config
from bot.domain import DM_SPACE, ConversationKey
from bot.errors import MeshsageError
from bot.memory.store import SqliteStore
from bot.transports.discord import build_discord
from tests.conftest import make_config
from tests.fakes.fake_discord import ALICE, CHANNEL_ID, GUILD_ID, TOKEN, FakeDiscord
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

SITE = Path(__file__).parent / "fakes" / "discord_site"
CHANNEL_SPACE = f"guild:{GUILD_ID}:ch:{CHANNEL_ID}"


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    server = FakeDiscord()
    await server.start()
    server.patch(monkeypatch)
    yield server
    await server.stop()


async def start_app(tmp_path: Path, llm: FakeLLM, fake: FakeDiscord, *others: FakeTransport) -> App:
    config = make_config(tmp_path, llm.base_url, f"discord:\n  channels: [{CHANNEL_ID}]\n")
    assert config.discord is not None
    discord_transport = build_discord(config.discord, env={"DISCORD_TOKEN": TOKEN})
    app = await build(config, env={}, transports=[discord_transport, *others])
    await app.start()
    await asyncio.wait_for(fake.ready.wait(), 5)
    return app


async def exchange(app: App, fake: FakeDiscord, data: dict[str, Any]) -> str:
    """Send one Discord message, wait for the bot's post, return its text."""
    before = len(fake.sent)
    await fake.say(data)
    sent = await fake.wait_sent(before + 1)
    await app.responder.wait_idle()
    return sent[before].content


def prompt_of_last_call(llm: FakeLLM) -> str:
    return "\n".join(m["content"] for m in llm.chat_requests()[-1]["messages"])


async def test_dm_content_never_reaches_a_channel_reply(
    tmp_path: Path, fake_llm: FakeLLM, fake: FakeDiscord
) -> None:
    app = await start_app(tmp_path, fake_llm, fake)
    try:
        await exchange(app, fake, fake.dm_message("my locker code is PINEAPPLE42"))
        answer = await exchange(
            app, fake, fake.guild_message("what is my locker code?", mention_bot=True)
        )
        assert answer == "Hello from fake"
        assert "PINEAPPLE42" not in prompt_of_last_call(fake_llm)
        # The same question in the DM does use the DM's memory: the check above can fail.
        await exchange(app, fake, fake.dm_message("what is my locker code?"))
        assert "PINEAPPLE42" in prompt_of_last_call(fake_llm)
        channel = await app.store.find_conversation(
            ConversationKey("discord", str(ALICE), CHANNEL_SPACE)
        )
        assert channel is not None
        texts = [m.text for m in await app.store.all_messages(channel.id)]
        assert texts == ["what is my locker code?", "Hello from fake"]
    finally:
        await app.close()


async def test_reset_on_discord_leaves_mesh_conversation(
    tmp_path: Path, fake_llm: FakeLLM, fake: FakeDiscord
) -> None:
    mesh = FakeTransport(name="meshtastic")
    app = await start_app(tmp_path, fake_llm, fake, mesh)
    person = str(ALICE)  # the same id on both transports: only the transport tells them apart
    try:
        await mesh.say("my radio is a T-Beam", sender=person)
        await app.responder.wait_idle()
        await exchange(app, fake, fake.dm_message("my bike is red"))
        reset = await exchange(app, fake, fake.dm_message("!reset"))
        assert reset.startswith("Fresh start")

        await exchange(app, fake, fake.dm_message("what colour is my bike?"))
        assert "my bike is red" not in prompt_of_last_call(fake_llm)
        await mesh.say("which radio do I have?", sender=person)
        await app.responder.wait_idle()
        assert "my radio is a T-Beam" in prompt_of_last_call(fake_llm)
    finally:
        await app.close()


async def test_export_sends_the_conversation_by_dm(
    tmp_path: Path, fake_llm: FakeLLM, fake: FakeDiscord
) -> None:
    app = await start_app(tmp_path, fake_llm, fake)
    try:
        await exchange(app, fake, fake.dm_message("my cat is called Miso"))
        await fake.say(fake.guild_message("!export", mention_bot=True))
        _, notice, files = await fake.wait_sent(3)
        await app.responder.wait_idle()
        assert notice.channel_id == CHANNEL_ID and "privately" in notice.content
        assert files.channel_id == fake.dm_channel_id(ALICE)
        named = dict(files.files)
        markdown = named["meshsage-export-discord.md"].decode()
        assert "my cat is called Miso" in markdown
        doc = json.loads(named["meshsage-export-discord.json"])
        assert (doc["transport"], doc["person"]) == ("discord", str(ALICE))
        [dm] = [c for c in doc["conversations"] if c["space"] == DM_SPACE]
        texts = [m["text"] for m in dm["messages"]]
        assert texts == ["my cat is called Miso", "Hello from fake"]
    finally:
        await app.close()


async def test_missing_token_leaves_console_running(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    fake_llm.reply = "console answer"
    config = make_config(tmp_path, fake_llm.base_url, "console:\n  user: alice\ndiscord:\n")
    out = io.StringIO()
    app = await build(config, env={}, stdin=io.BytesIO(b"hello\n"), stdout=out)
    await asyncio.wait_for(app.run(asyncio.Event()), 20)  # ends at the console's EOF
    assert "console answer" in out.getvalue()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "DISCORD_TOKEN" in errors[0]


async def test_meshsage_run_serves_console_and_discord_on_one_database(
    tmp_path: Path, fake_llm: FakeLLM, fake: FakeDiscord
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
        FAKE_DISCORD_PORT=str(fake.port),
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
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line.decode().strip() == "Hello from fake"
        await asyncio.wait_for(fake.ready.wait(), 20)
        await fake.say(fake.dm_message("hello from Discord"))
        [sent] = await fake.wait_sent(1, timeout=20)
        assert sent.content == "Hello from fake"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
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
