"""Two real gateway processes (``meshsage chat``: the console transport scripted through
stdin) sharing one PostgreSQL memory: the same person writes to both at once and gets one
answer from each, in order; and two gateways hearing the same radio packet answer it once.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import pg_server
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")


def _gateway_config(tmp_path: Path, name: str, llm: FakeLLM, url: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"state_dir: {tmp_path / name}\n"
        f"llm:\n  base_url: {llm.base_url}\n  model: fake\n  retries: 0\n"
        f"storage:\n  url: '{url}'\n  password_env: {pg_server.PASSWORD_ENV}\n"
        "console:\n  user: alice\n",
        encoding="utf-8",
    )
    return path


async def _start(config: Path) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update({pg_server.PASSWORD_ENV: pg_server.BOT_PASSWORD, "TIKTOKEN_CACHE_DIR": ""})
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "chat", "--config", str(config),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip


def words(content: str) -> str:
    """A prompt's final message without the date line a day's first message opens with."""
    return re.sub(r"^\[\d+ \w+ \d+\]\n", "", content)


def _echo(body: dict[str, Any]) -> str:
    return "answer to " + words(str(body["messages"][-1]["content"]))


async def test_same_person_on_two_gateways_one_answer_each_in_order(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    fake_llm.reply_fn = _echo
    fake_llm.script = [("sleep", 1.5)]  # gateway 1's answer is slow: gateway 2 must wait
    one = await _start(_gateway_config(tmp_path, "one", fake_llm, url))
    two = await _start(_gateway_config(tmp_path, "two", fake_llm, url))
    assert one.stdin is not None and two.stdin is not None
    one.stdin.write(b"first question\n")
    await one.stdin.drain()
    for _ in range(3000):  # up to 30 s for gateway 1 to start and ask the LLM
        if fake_llm.in_flight or one.returncode is not None:
            break
        await asyncio.sleep(0.01)
    if fake_llm.in_flight != 1:  # say why gateway 1 never asked
        one.kill()
        raise AssertionError((await one.communicate())[1].decode())
    two.stdin.write(b"second question\n")
    await two.stdin.drain()
    one.stdin.close()
    out_one, err_one = await asyncio.wait_for(one.communicate(), 60)
    two.stdin.close()
    out_two, err_two = await asyncio.wait_for(two.communicate(), 60)
    assert (one.returncode, two.returncode) == (0, 0), (err_one.decode(), err_two.decode())
    assert out_one.decode().strip() == "answer to first question"
    assert out_two.decode().strip() == "answer to second question"
    assert fake_llm.peak_in_flight == 1  # never both at once: the turn lock held across them
    first, second = fake_llm.chat_requests()
    assert words(first["messages"][-1]["content"]) == "first question"
    assert words(second["messages"][-1]["content"]) == "second question"
    earlier = [words(m["content"]) for m in second["messages"][:-1]]
    assert "first question" in earlier and "answer to first question" in earlier  # in order


async def test_a_packet_heard_by_two_gateways_is_answered_once(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    from bot.app import build

    fake_llm.reply_fn = _echo
    extra = f"storage:\n  url: '{url}'\n  password_env: PW\n"
    apps, radios = [], []
    for name in ("site-a", "site-b"):
        radio = FakeTransport(name="mesh")
        (tmp_path / name).mkdir()
        config = make_config(tmp_path / name, fake_llm.base_url, extra)
        app = await build(config, env={"PW": pg_server.BOT_PASSWORD}, transports=[radio])
        await app.start()
        apps.append(app)
        radios.append(radio)
    try:
        await asyncio.gather(
            *(r.say("is the pass open?", sender="!0000abcd", message_id="3141") for r in radios)
        )
        for app in apps:
            await app.responder.wait_idle()
        answers = [s.text for r in radios for s in r.sent]
        assert answers == ["answer to is the pass open?"]
        assert len(fake_llm.chat_requests()) == 1
    finally:
        for app in apps:
            await app.close()
