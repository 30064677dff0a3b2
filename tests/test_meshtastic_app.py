"""The Meshtastic transport inside the real app (responder, SQLite memory, openai client over
HTTP to the fake LLM), on the fake radio and the virtual clock: what the model is asked for,
what goes on air, what is stored, and the delivery result recorded per answer."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bot.app import App, build
from bot.transports.mesh_text import MARKER, split_parts
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE
from tests.fakes.mesh_harness import Harness, mesh_harness

STORY = " ".join(f"Sentence number {i} of a long story goes right here." for i in range(40))


@contextlib.asynccontextmanager
async def running_app(
    tmp_path: Path, llm: FakeLLM, h: Harness, **build_kw: Any
) -> AsyncIterator[App]:
    """The app with the harness's (unstarted) transport; closed before the harness stops.
    ``build_kw`` goes to ``build`` (``clock=h.clock.monotonic``: outbox ages on virtual time)."""
    app = await build(
        make_config(tmp_path, llm.base_url), env={}, transports=[h.transport], **build_kw
    )
    try:
        await app.start()
        await h.connected()
        yield app
    finally:
        await app.close()


async def _answers(app: App) -> list[tuple[str, str, str]]:
    rows = await app.store._all(
        "SELECT m.role, m.text, m.status FROM messages m JOIN conversations c "
        "ON c.id = m.conversation_id WHERE c.person = ? ORDER BY m.id",
        (f"!{ALICE:08x}",),
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def test_long_answer_is_kept_whole_sent_cut_and_the_rest_comes_with_more(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = STORY  # about 2,100 bytes: far beyond 3 packets
    async with (
        mesh_harness(start=False, max_parts=3, max_tokens=120) as h,
        running_app(tmp_path, fake_llm, h) as app,
    ):
        h.radio.inject_text("tell me a story", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 3, "three parts on air")
        await h.until(lambda: len(fake_llm.chat_requests()) == 1, "the LLM call")
        await app.responder.wait_idle()
        (user, assistant) = await _answers(app)
        assert user == ("user", "tell me a story", "answered")
        role, stored, status = assistant
        assert (role, status) == ("assistant", "delivered")  # every part ACKed by Alice
        assert stored == STORY  # memory keeps the whole answer the model gave
        [(sent_text, state)] = await app.store._all("SELECT text, state FROM outbox")
        assert state == "delivered" and sent_text.endswith(MARKER + " (!more)")
        on_air = [p.decoded.payload.decode("utf-8") for _, p in h.radio.sent_texts()]
        parts = split_parts(sent_text, chunk_bytes=200, max_parts=3)
        assert on_air == [f"({i}/3) {p.body}" for i, p in enumerate(parts, 1)]
        assert all(len(t.encode()) > 150 for t in on_air[:-1])  # no wasted packets
        request = fake_llm.chat_requests()[0]
        assert request["max_tokens"] == 120  # the budget the model is given ...
        system = request["messages"][0]["content"]
        assert "200 bytes" in system and "600 bytes" in system  # ... and told, sized to 3 parts
        h.radio.inject_text("!more", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 6, "the next three parts")
        await app.responder.wait_idle()
        more = [p.decoded.payload.decode("utf-8") for _, p in h.radio.sent_texts()[3:]]
        resumed = sent_text.removesuffix(MARKER + " (!more)").split()[-1]
        assert resumed in STORY and more[0].startswith("(1/3) Sentence number")
        assert len(fake_llm.chat_requests()) == 1  # !more does not ask the model again


async def test_unacknowledged_answer_is_recorded_as_failed(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Short answer."
    async with (
        mesh_harness(start=False, ack_retries=1, ack_timeout=30.0) as h,
        running_app(tmp_path, fake_llm, h) as app,
    ):
        h.radio.routing = lambda packet, attempt: None  # Alice went out of range: no ACK ever
        h.radio.inject_text("are you there?", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 2, "first try and one re-send")
        await app.responder.wait_idle()  # the turn ends once the last ACK wait timed out
        assert (await _answers(app))[-1] == ("assistant", "Short answer.", "failed")


async def _texts_to(h: Harness, num: int) -> list[str]:
    return [bytes(p.decoded.payload).decode() for _, p in h.radio.sent_texts() if p.to == num]


async def test_forget_then_yes_works_with_ten_people_waiting(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "An answer for you."
    others = [0xE0000001 + i for i in range(10)]
    async with (
        mesh_harness(start=False, cooldown=0.0) as h,
        running_app(tmp_path, fake_llm, h) as app,
    ):
        h.radio.inject_text("remember me", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "Alice's answer")
        for num in others:
            h.radio.inject_text("a question", frm=num)
        h.radio.inject_text("!forget", frm=ALICE)
        h.radio.inject_text("!forget yes", frm=ALICE)  # at once, before the prompt is on air
        await h.until(lambda: len(h.radio.sent_texts()) == 13, "every reply on air")
        await app.responder.wait_idle()
        alice = await _texts_to(h, ALICE)
        assert alice[1].startswith("This deletes all I keep about you")
        assert alice[2].startswith("Deleted everything I kept about you: 2 messages")
        assert await _answers(app) == []


async def test_the_same_words_with_new_packet_ids_are_answered_each_time(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Yes indeed."
    async with (
        mesh_harness(start=False, cooldown=0.0) as h,
        running_app(tmp_path, fake_llm, h) as app,
    ):
        for n in range(1, 4):
            h.radio.inject_text("yes", frm=ALICE)  # a new packet id each time
            await h.until(lambda: len(h.radio.sent_texts()) == n, f"answer {n}")  # noqa: B023
        h.radio.inject_text("!history", frm=ALICE)
        h.radio.inject_text("!history", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 5, "five replies")
        await app.responder.wait_idle()
        assert [r[0] for r in await _answers(app)] == ["user", "assistant"] * 3
        assert len(fake_llm.chat_requests()) == 3
