"""Shutdown has ONE deadline (issue 18): ``App.close`` ends within ``stop_seconds`` even when
the model, a transport's send and a transport's stop all hang, so systemd's TimeoutStopSec
never has to SIGKILL the bot. What was cut off is not lost and not marked sent: the question
stays pending, the answer's outbox row stays pending, and after a restart each person gets
exactly one answer.

No wall-clock limit is asserted (a loaded machine is slow): the proof is that the hanging
steps were cancelled (or left behind) by the deadline, named in ``App.cut_at_stop``, and that
the store says pending. The real app, the real SQLite store (and PostgreSQL), the real openai
client against the fake LLM over HTTP.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.app import App, build
from bot.domain import Delivery, Reply
from tests import pg_server
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

BUDGET = 3.0  # seconds: drain by 1.8 s, transports by 2.4 s, the store closes by 3 s


class HangingTransport(FakeTransport):
    """A link that takes nothing and a stop that never returns. ``stubborn``: the stop also
    swallows its first cancel (a buggy library), so the app must leave it behind."""

    def __init__(self, *, stubborn: bool = False) -> None:
        super().__init__(name="mesh")
        self.stubborn = stubborn
        self.stop_cancelled = asyncio.Event()
        self.release = asyncio.Event()  # lets a stubborn stop end when the test is over
        self.sending = asyncio.Event()

    async def send(self, reply: Reply) -> Delivery:
        self.sending.set()
        await asyncio.Event().wait()  # the radio never takes it
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stop_cancelled.set()
            if not self.stubborn:
                raise
        await self.release.wait()


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    if request.param == "sqlite":
        return "", {}
    pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")
    url = request.getfixturevalue("url")
    return (
        f"storage:\n  url: '{url}'\n  password_env: PW\n  gateway: budget\n",
        {"PW": pg_server.BOT_PASSWORD},
    )


async def _app(
    tmp_path: Path, llm: FakeLLM, storage: tuple[str, dict[str, str]], side: FakeTransport
) -> App:
    extra, env = storage
    app = await build(make_config(tmp_path, llm.base_url, extra), env=env, transports=[side])
    app.stop_seconds = BUDGET
    await app.start()
    return app


async def _until(check: object, what: str) -> None:
    for _ in range(3000):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("stubborn", [False, True], ids=["stop hangs", "stop ignores cancel"])
async def test_close_keeps_one_deadline_and_the_restart_answers_each_once(
    tmp_path: Path, fake_llm: FakeLLM, storage: tuple[str, dict[str, str]], stubborn: bool
) -> None:
    # (the words of the message, after the date line a first message opens with)
    fake_llm.reply_fn = lambda body: "answer to " + body["messages"][-1]["content"].split("\n")[-1]
    side = HangingTransport(stubborn=stubborn)
    app = await _app(tmp_path, fake_llm, storage, side)
    try:
        # bob's answer is stored and on its way to a radio that never takes it
        await side.say("bob question", sender="!0000b0b0")
        await _until(side.sending.is_set, "bob's answer being sent")
        # alice's model call hangs (the model never answers)
        fake_llm.script = [("sleep", 3600.0)]
        starts = len([e for e in fake_llm.events if e[0] == "start"])
        await side.say("alice question", sender="!0000a11c")
        await _until(
            lambda: len([e for e in fake_llm.events if e[0] == "start"]) > starts,
            "alice's model call",
        )
        await app.close()
        # the hanging stop was cancelled by the deadline (the stubborn one left running)
        assert side.stop_cancelled.is_set()
        assert app.cut_at_stop[0] == "stopping mesh"  # background steps may follow it
        assert "the database" not in app.cut_at_stop
        assert not app.responder.parts.queue.workers  # the drain cut both turns at its share
    finally:
        side.release.set()

    fake_llm.script = []
    again = FakeTransport(name="mesh")
    app = await _app(tmp_path, fake_llm, storage, again)
    try:
        await _until(lambda: len(again.sent) >= 2, "both answers after the restart")
        await app.responder.wait_idle()
        await asyncio.sleep(0.3)  # a second send would show here
        by_person = sorted((r.inbound.sender, r.text) for r in again.sent)
        assert by_person == [
            ("!0000a11c", "answer to alice question"),
            ("!0000b0b0", "answer to bob question"),
        ]
        assert await app.store.undelivered(transports=["mesh"]) == []
    finally:
        await app.close()
    asked = [r["messages"][-1]["content"].split("\n")[-1] for r in fake_llm.chat_requests()]
    # bob's answer came from the outbox (the model asked once); alice's question stayed
    # pending (the model was cut) and was asked again
    assert asked.count("bob question") == 1
    assert asked.count("alice question") == 2
