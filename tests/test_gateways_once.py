"""A stored question is answered exactly once across gateways (issue 21 point 3): two real
``meshsage chat`` processes on one PostgreSQL, the first killed with SIGKILL while its model
call is in flight. The other gateway's next turn answers its own question only (the left one is
never folded in); the left question stays claimed by the killed gateway until its claim is
stale (then any running gateway takes it over), and its own restart answers it once. The
compare-and-set claim itself is checked on both stores."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.memory.keep import CLAIM_STALE_SECONDS
from bot.memory.port import MemoryStore
from tests import pg_server
from tests.fakes.fake_llm import FakeLLM
from tests.test_gateways import _echo, _gateway_config, _start, words
from tests.test_store_contract import ALICE, IMPLEMENTATIONS

pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")


async def _killed_mid_turn(tmp_path: Path, fake_llm: FakeLLM, url: str) -> None:
    """Gateway one takes "first question", asks the (slow) model, and is killed -9."""
    fake_llm.reply_fn = _echo
    fake_llm.script = [("sleep", 25.0)]
    one = await _start(_gateway_config(tmp_path, "one", fake_llm, url))
    assert one.stdin is not None
    one.stdin.write(b"first question\n")
    await one.stdin.drain()
    # Wait for the model call to be *logged* ("start": its body read and stored in
    # ``requests``), not merely for a connection (``in_flight`` counts one before the body is
    # read: a kill then left no request behind, and the tests counting two calls failed).
    for _ in range(3000):
        if ("start", 0) in fake_llm.events or one.returncode is not None:
            break
        await asyncio.sleep(0.01)
    if ("start", 0) not in fake_llm.events:
        one.kill()
        raise AssertionError((await one.communicate())[1].decode())
    one.kill()  # SIGKILL: no shutdown, the question stays pending (claimed by "one")
    await one.wait()


async def _run(tmp_path: Path, name: str, fake_llm: FakeLLM, url: str, text: str) -> str:
    """Start gateway ``name``, type ``text`` (may be empty), end input; its whole output."""
    proc = await _start(_gateway_config(tmp_path, name, fake_llm, url))
    assert proc.stdin is not None
    if text:
        proc.stdin.write(text.encode() + b"\n")
        await proc.stdin.drain()
    proc.stdin.close()
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


async def test_a_killed_gateways_question_gets_its_own_answer_once(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    await _killed_mid_turn(tmp_path, fake_llm, url)
    out = await _run(tmp_path, "two", fake_llm, url, "second question")
    _first, second = fake_llm.chat_requests()
    asked = second["messages"][-1]["content"]
    assert asked.endswith("second question")
    assert out == f"answer to {words(asked)}"  # the first question is not folded into this answer
    # the first question's claim is fresh: its own gateway's restart answers it, once
    assert await _run(tmp_path, "one", fake_llm, url, "") == "answer to first question"
    assert await _run(tmp_path, "two", fake_llm, url, "") == ""
    assert await _run(tmp_path, "one", fake_llm, url, "") == ""
    assert len(fake_llm.chat_requests()) == 3


async def test_a_fresh_claim_is_left_to_its_gateway_which_answers_it_once(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    await _killed_mid_turn(tmp_path, fake_llm, url)
    assert await _run(tmp_path, "two", fake_llm, url, "") == ""  # one's claim is fresh
    assert await _run(tmp_path, "one", fake_llm, url, "") == "answer to first question"
    assert await _run(tmp_path, "two", fake_llm, url, "") == ""
    assert await _run(tmp_path, "one", fake_llm, url, "") == ""
    assert len(fake_llm.chat_requests()) == 2  # the killed call and the one answer


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    store = await IMPLEMENTATIONS[request.param](tmp_path)
    yield store
    await store.close()


async def test_claim_is_compare_and_set_and_answered_questions_are_never_taken(
    memory: MemoryStore,
) -> None:
    conv = await memory.conversation(ALICE)
    q = await memory.add_message(conv.id, role="user", author="a", text="q", tokens=1,
                                 status="pending")  # fmt: skip
    fresh = time.time() - CLAIM_STALE_SECONDS
    assert await memory.claim_question(q, stale_before=fresh)
    assert await memory.claim_question(q, stale_before=fresh)  # ours again: renewed
    later = await memory.add_message(conv.id, role="user", author="a", text="q2", tokens=1,
                                     status="pending")  # fmt: skip
    listed = [m.id for _, m in await memory.pending_messages(since=0, transports=["mesh"])]
    assert listed == [q, later]  # each is answered on its own, in order
    assert await memory.mark_answered(conv.id, [q]) == 1
    assert not await memory.claim_question(q, stale_before=time.time() + 1)  # not pending
    assert await memory.mark_answered(conv.id, [q]) == 0


async def test_link_codes_work_across_gateways_and_a_race_has_one_winner(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    """A code from the radio gateway works on the Discord gateway (issue 21 point 4), and the
    same code sent at once to two gateways links exactly one account."""
    from bot.app import build
    from tests.conftest import make_config
    from tests.fakes.fake_transport import FakeTransport

    fake_llm.reply = "ok"
    extra = f"storage:\n  url: '{url}'\n  password_env: PW\n"
    apps, sides = [], []
    for name, transport in (("radio", "mesh"), ("chat-a", "discord"), ("chat-b", "discord")):
        side = FakeTransport(name=transport)
        (tmp_path / name).mkdir()
        app = await build(make_config(tmp_path / name, fake_llm.base_url, extra),
                          env={"PW": pg_server.BOT_PASSWORD}, transports=[side])  # fmt: skip
        await app.start()
        apps.append(app)
        sides.append(side)
    radio, chat_a, chat_b = sides
    try:
        await radio.say("!link", sender="!1234abcd")
        await apps[0].responder.wait_idle()
        code = radio.texts()[-1].split("code is ")[1][:6]
        await asyncio.gather(chat_a.say(f"!link {code}", sender="1001"),
                             chat_b.say(f"!link {code}", sender="2002"))  # fmt: skip
        for app in apps:
            await app.responder.wait_idle()
        answers = [chat_a.texts()[-1], chat_b.texts()[-1]]
        assert sum(a.startswith("Linked with your mesh account") for a in answers) == 1, answers
        assert sum(a.startswith("No link made") for a in answers) == 1, answers
    finally:
        for app in apps:
            await app.close()


async def test_forget_on_one_gateway_while_the_other_answers_the_same_person(
    tmp_path: Path, fake_llm: FakeLLM, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Gateway A is mid-answer (slow model) when gateway B runs !forget for the same person:
    afterwards no table holds the person's words, whichever finished first, and A's turn
    ends quietly (no "storage problem" notice to the person, no ERROR line)."""
    from bot.app import build
    from tests.conftest import make_config
    from tests.fakes.fake_transport import FakeTransport
    from tests.test_memory_promises import _marker_anywhere

    fake_llm.reply_fn = _echo
    fake_llm.script = [("sleep", 2.0)]
    extra = f"storage:\n  url: '{url}'\n  password_env: PW\n"
    apps, radios = [], []
    for name in ("site-a", "site-b"):
        radio = FakeTransport(name="mesh")
        (tmp_path / name).mkdir()
        app = await build(make_config(tmp_path / name, fake_llm.base_url, extra),
                          env={"PW": pg_server.BOT_PASSWORD}, transports=[radio])  # fmt: skip
        await app.start()
        apps.append(app)
        radios.append(radio)
    try:
        await radios[0].say("my boat is called Selkie", sender="!0000abcd", message_id="1")
        for _ in range(3000):
            if fake_llm.in_flight:
                break
            await asyncio.sleep(0.01)
        assert fake_llm.in_flight == 1
        await radios[1].say("!forget", sender="!0000abcd", message_id="2")
        await apps[1].responder.wait_idle()
        await radios[1].say("!forget yes", sender="!0000abcd", message_id="3")
        for app in apps:
            await app.responder.wait_idle()
        assert radios[1].texts()[-1].startswith("Deleted everything"), radios[1].texts()
        assert await _marker_anywhere(apps[0].store, "Selkie") == []
        assert not any("storage problem" in t for t in radios[0].texts()), radios[0].texts()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        for app in apps:
            await app.close()
