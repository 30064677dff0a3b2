"""Holds (duty cycle spent, channel full) never drop a question: the real app (responder,
SQLite outbox, openai client over HTTP to the fake LLM) with the real Meshtastic transport and
the unmodified library against the fake radio, which reports device metrics every 60 s of the
virtual clock like the firmware; the app's outbox round runs every 10 virtual seconds.

Each question ends in one of three states the person can see: its own answer, a notice on air
saying what happened, or (on a hold) an answer kept in the outbox and sent when room returns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import App, build
from bot.delivery import EXPIRED
from bot.domain import Inbound
from bot.responder import ANSWER_NOT_STORED
from bot.transports.mesh_rules import node_id
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE, BOB, Later
from tests.fakes.mesh_harness import Harness, every, hold_clock_while_busy, mesh_harness

PEOPLE = [0xC0000001 + i for i in range(30)]
TAG = re.compile(r"q\d+")


def _tagged(body: dict[str, Any]) -> str:
    """The fake model answers with the question's tag, so each answer names its question."""
    tag = TAG.findall(str(body["messages"][-1]["content"]))[-1]
    return f"Answer {tag}."


@contextlib.asynccontextmanager
async def _app(tmp_path: Path, llm: FakeLLM, h: Harness, extra: str) -> AsyncIterator[App]:
    config = make_config(tmp_path, llm.base_url, extra)  # limits and ages on the fake clock:
    app = await build(config, env={}, transports=[h.transport], clock=h.clock.monotonic)
    try:
        await app.start()
        await h.connected()
        yield app
    finally:
        await app.close()


@contextlib.asynccontextmanager
async def _held_app(
    tmp_path: Path, llm: FakeLLM, *, tx: float, extra: str = "", **settings: Any
) -> AsyncIterator[tuple[Harness, App]]:
    """The app on a radio whose node reports ``tx`` percent of its hour on air."""
    llm.reply_fn = _tagged
    async with (
        mesh_harness(start=False, spacing_seconds=3.0, metrics_every=60, **settings) as h,
        _app(tmp_path, llm, h, extra) as app,
        every(h.clock, 10.0, app.responder.redeliver),
    ):
        hold_clock_while_busy(h, app)
        h.radio.air_util_tx = tx
        h.radio.report_metrics()
        await h.until(lambda: h.transport.busy() is not None, "the hold")
        yield h, app


def _shown(h: Harness, node: int) -> list[tuple[float, str]]:
    return [(t, p.decoded.payload.decode()) for t, p in h.radio.shown if p.to == node]


async def _settled(h: Harness, app: App, questions: int) -> None:
    async def done() -> bool:
        rows = await app.store._all("SELECT count(*) FROM outbox WHERE state = 'pending'")
        answered = await app.store._all("SELECT count(*) FROM outbox WHERE kind = 'answer'")
        return bool(rows[0][0] == 0 and answered[0][0] == questions)

    for _ in range(3000):
        if await done():
            return
        await h.clock.sleep(5)
    raise AssertionError("the outbox never emptied")


async def test_a_duty_cycle_the_radio_reports_spent_holds_answers_and_drops_none(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 28's case: the node reports airUtilTx 12% for 10 minutes, then 2%. Before, both
    questions were marked limited and never answered, and nothing went on air for 25 min."""
    caplog.set_level(logging.INFO)
    async with _held_app(tmp_path, fake_llm, tx=12.0) as (h, app):
        t0 = h.clock.monotonic()
        h.radio.inject_text("q1 weather?", frm=ALICE)
        h.radio.inject_text("q2 tides?", frm=BOB)
        await h.until(lambda: len(fake_llm.chat_requests()) == 2, "both answers written now")
        while h.clock.monotonic() < t0 + 600:
            await h.clock.sleep(30)
        assert h.radio.sent_texts() == []  # over the duty cycle: not even a notice (illegal)
        health = h.transport.health()
        assert health.link == "up" and health.detail.startswith("holding replies")
        assert "duty cycle" in health.detail
        h.radio.air_util_tx = 2.0  # the next one-minute report frees the bot
        await _settled(h, app, 2)
        assert [text for _, text in _shown(h, ALICE)] == ["Answer q1."]
        assert [text for _, text in _shown(h, BOB)] == ["Answer q2."]
        assert all(t0 + 600 <= t <= t0 + 600 + 90 for t, _ in h.radio.shown)
        statuses = await app.store._all("SELECT status FROM messages WHERE role = 'user'")
        assert [r[0] for r in statuses] == ["answered", "answered"]
    said = [r.getMessage() for r in caplog.records]
    assert not any("try later" in m or "try again" in m for m in said)  # the old lie
    assert sum("nothing may go on air now" in m for m in said) == 2


async def test_a_person_asking_while_nothing_may_go_is_told_first_once_the_radio_may(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """The node reports its hour over the duty cycle (the firmware refuses every packet) for
    about a minute: the hold notice waits in the person's lane and is the first packet on air
    once the radio may transmit, before the held answer. Before, no notice was even tried
    (the answer, later, was the first the person heard)."""
    async with _held_app(tmp_path, fake_llm, tx=12.0) as (h, app):
        t0 = h.clock.monotonic()
        h.radio.inject_text("q1 weather?", frm=ALICE)
        await h.until(lambda: len(fake_llm.chat_requests()) == 1, "the answer written now")
        while h.clock.monotonic() < t0 + 30:
            await h.clock.sleep(10)
        assert h.radio.sent_texts() == []  # nothing may go on air
        h.radio.air_util_tx = 9.5  # the next report: a notice may go, answers still may not
        await h.until(lambda: len(h.radio.shown) == 1, "the notice")
        [(told_at, notice)] = _shown(h, ALICE)
        assert notice.startswith("Airtime limit reached. Your answer is saved")
        assert told_at - t0 <= h.config.busy_max_wait
        h.radio.air_util_tx = 1.0
        await _settled(h, app, 1)
        assert [text for _, text in _shown(h, ALICE)][1:] == ["Answer q1."]


async def test_within_the_notice_reserve_people_are_told_then_answered(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Answers stop at 90% of the duty cycle; one-packet notices may use the rest, so a person
    asking meanwhile hears why at once, and the answer follows when room returns."""
    async with _held_app(tmp_path, fake_llm, tx=9.5) as (h, app):
        t0 = h.clock.monotonic()
        h.radio.inject_text("q1 weather?", frm=ALICE)
        await h.until(lambda: len(h.radio.shown) == 1, "the notice")
        [(told_at, notice)] = _shown(h, ALICE)
        assert notice.startswith("Airtime limit reached. Your answer is saved")
        assert told_at - t0 <= h.config.busy_max_wait
        while h.clock.monotonic() < t0 + 300:
            await h.clock.sleep(30)
        assert len(h.radio.shown) == 1  # the answer is held meanwhile
        h.radio.air_util_tx = 1.0
        await _settled(h, app, 1)
        assert [text for _, text in _shown(h, ALICE)][1:] == ["Answer q1."]


async def test_thirty_people_asking_during_a_hold_are_all_told_and_all_answered(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    async with _held_app(tmp_path, fake_llm, tx=9.5) as (h, app):
        t0 = h.clock.monotonic()
        for i, node in enumerate(PEOPLE):
            h.radio.inject_text(f"q{i} what now?", frm=node)
        await h.until(
            lambda: len(h.radio.shown) == len(PEOPLE),
            "30 notices",
        )
        told = [h.radio.shown[i][0] - t0 for i in range(len(PEOPLE))]
        assert all(p.decoded.payload.startswith(b"Airtime limit") for _, p in h.radio.shown)
        while h.clock.monotonic() < t0 + 400:
            await h.clock.sleep(30)
        h.radio.air_util_tx = 1.0
        await _settled(h, app, len(PEOPLE))
        for i, node in enumerate(PEOPLE):
            texts = [text for _, text in _shown(h, node)]
            assert texts[0].startswith("Airtime limit") and texts[1:] == [f"Answer q{i}."]
    # the notices count against the bot's minute (up to the firmware's 25%): 30 x 0.85 s
    assert max(told) <= h.config.busy_max_wait  # measured: the last after 99 s


async def test_a_command_during_a_hold_runs_and_its_reply_waits_in_the_outbox(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Before, ``_command`` answered a hold with a notice that was itself held and dropped, and
    the command never ran."""
    async with _held_app(tmp_path, fake_llm, tx=12.0) as (h, app):
        h.radio.inject_text("!help", frm=ALICE)
        await h.until(lambda: h.transport._jobs != [], "the reply, held")
        rows = await app.store._all("SELECT kind, state FROM outbox")
        assert [tuple(r) for r in rows] == [("command", "pending")]
        h.radio.air_util_tx = 1.0
        for _ in range(100):
            if h.radio.shown:
                break
            await h.clock.sleep(10)
        await app.responder.wait_idle()
        [(_, text)] = _shown(h, ALICE)
        assert "!more" in text or "!" in text  # the help text, once
        rows = await app.store._all("SELECT kind, state FROM outbox")
        assert [tuple(r) for r in rows] == [("command", "delivered")]


async def test_a_disk_that_fills_during_a_hold_still_gets_the_person_told(
    tmp_path: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer cannot be stored (disk full) while nothing may go on air: the notice saying
    so is kept in memory, stored once the disk has room, and sent when the hold ends."""
    async with _held_app(tmp_path, fake_llm, tx=12.0) as (h, app):

        async def full(*args: object, **kwargs: object) -> Any:
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(app.store, "queue_claimed", full)
        monkeypatch.setattr(app.store, "queue_delivery", full)
        h.radio.inject_text("q1 weather?", frm=ALICE)
        await h.until(lambda: len(fake_llm.chat_requests()) == 1, "the answer")
        await h.until(lambda: len(app.responder.parts.outbox._unstored) == 1, "kept in memory")
        monkeypatch.undo()  # room on the disk again: the next round stores the notice
        await h.clock.sleep(30)
        rows = await app.store._all("SELECT kind, state, text FROM outbox")
        assert [tuple(r) for r in rows] == [("notice", "pending", ANSWER_NOT_STORED)]
        h.radio.air_util_tx = 1.0
        await _settled(h, app, 0)
        assert [text for _, text in _shown(h, ALICE)] == [ANSWER_NOT_STORED]


async def test_a_limit_notice_that_must_wait_never_holds_up_other_peoples_messages(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Before, the intake awaited the notice on the radio's receive loop: held by the airtime
    rules, it kept every later message (anyone's) from being stored for busy_max_wait."""
    limit = "bot:\n  rate_limit: {messages: 1, per_seconds: 3600}\n"
    async with _held_app(tmp_path, fake_llm, tx=12.0, extra=limit) as (h, app):
        t0 = h.clock.monotonic()
        h.radio.inject_text("q1 first", frm=ALICE)
        h.radio.inject_text("q2 too soon", frm=ALICE)  # over the limit: a notice, held
        h.radio.inject_text("q3 hello", frm=BOB)
        await h.until(lambda: len(fake_llm.chat_requests()) == 2, "q1 and q3 answered now")
        assert h.clock.monotonic() - t0 < h.config.busy_max_wait
        rows = await app.store._all("SELECT kind, state FROM outbox ORDER BY id")
        assert ("notice", "pending") in [tuple(r) for r in rows]  # the notice waits, stored
        h.radio.air_util_tx = 1.0
        await _settled(h, app, 2)
        texts = [text for _, text in _shown(h, ALICE)]
        # q1's answer once, the limit notice once; and the hold notice of q1, which went as
        # soon as the radio could transmit again (within busy_max_wait of asking)
        assert [t for t in texts if t.startswith("Answer")] == ["Answer q1."]
        assert sum(t.startswith("Slow down") for t in texts) == 1
        assert all(t.startswith(("Answer", "Slow down", "Airtime limit")) for t in texts)
        assert [text for _, text in _shown(h, BOB)][-1:] == ["Answer q3."]


async def test_a_limit_notice_goes_next_not_after_everything_the_person_queued(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    async with _held_app(tmp_path, fake_llm, tx=9.5) as (h, app):
        t0 = h.clock.monotonic()
        for i in range(1, 5):  # the 4th finds 3 waiting: over the queue limit
            h.radio.inject_text(f"q{i} question", frm=ALICE)
        await h.until(
            lambda: any(text.startswith("You have") for _, text in _shown(h, ALICE)),
            "the limit notice",
        )
        [told_at] = [t for t, text in _shown(h, ALICE) if text.startswith("You have")]
        # after the running job (q1, held up to busy_max_wait), before q2's and q3's turns
        assert told_at - t0 <= h.config.busy_max_wait + 30
        h.radio.air_util_tx = 1.0
        await _settled(h, app, 3)
        answers = [text for _, text in _shown(h, ALICE) if text.startswith("Answer")]
        assert answers == ["Answer q1.", "Answer q2.", "Answer q3."]


async def test_a_hold_notice_never_waits_behind_the_persons_own_held_answer(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """30 people ask during a duty-cycle hold (answers held, one-packet notices allowed), then
    each asks again while their first answer is still held. Before, the second notice waited
    behind the person's held answer (their worker sat on it up to busy_max_wait, then on each
    outbox round's re-offer), so people heard nothing for over busy_max_wait."""
    async with _held_app(tmp_path, fake_llm, tx=9.5) as (h, app):
        t0 = h.clock.monotonic()
        for i, node in enumerate(PEOPLE):
            h.radio.inject_text(f"q{i} what now?", frm=node)
        await h.until(lambda: len(h.radio.shown) == len(PEOPLE), "30 first notices")
        while h.clock.monotonic() < t0 + 150:  # every first answer held in the radio's outbox
            await h.clock.sleep(10)
        asked = h.clock.monotonic()
        for i, node in enumerate(PEOPLE):
            h.radio.inject_text(f"q{100 + i} and now?", frm=node)
        while h.clock.monotonic() < asked + h.config.busy_max_wait:
            await h.clock.sleep(5)
        late = [
            i
            for i, node in enumerate(PEOPLE)
            if not [t for t, _ in _shown(h, node) if asked <= t <= asked + h.config.busy_max_wait]
        ]
        assert late == []  # every person told within busy_max_wait of asking again
        h.radio.air_util_tx = 1.0
        await _settled(h, app, 2 * len(PEOPLE))
        for i, node in enumerate(PEOPLE):
            answers = [text for _, text in _shown(h, node) if text.startswith("Answer")]
            assert answers == [f"Answer q{i}.", f"Answer q{100 + i}."]


async def test_a_hold_longer_than_max_age_tells_the_person_once_that_it_expired(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Other nodes fill the channel (30%: answers held, notices still go) for longer than the
    mesh's ``delivery.max_age``: the held answer is never sent, and the person hears why, once.
    Before, outbox ages were wall-clock only, so on the virtual clock nothing ever expired (and
    in the soak the answer went out long after max_age)."""
    fake_llm.reply_fn = _tagged
    mesh = "meshtastic:\n  connection: tcp\n  host: 127.0.0.1\n  delivery: {max_age: 600}\n"
    async with (
        mesh_harness(start=False, spacing_seconds=3.0, metrics_every=60) as h,
        _app(tmp_path, fake_llm, h, mesh) as app,
        every(h.clock, 10.0, app.responder.redeliver),
    ):
        hold_clock_while_busy(h, app)
        h.radio.inject_channel_utilization(30.0)
        await h.until(lambda: h.transport.busy() is not None, "the hold")
        t0 = h.clock.monotonic()
        h.radio.inject_text("q1 weather?", frm=ALICE)
        while h.clock.monotonic() < t0 + 600 + 180:
            await h.clock.sleep(10)
        h.radio.inject_channel_utilization(2.0)  # room again: nothing old may go out now
        while h.clock.monotonic() < t0 + 600 + 600:
            await h.clock.sleep(10)
        await app.responder.wait_idle()
        texts = [text for _, text in _shown(h, ALICE)]
        assert texts[0].startswith("Channel busy. Your answer is saved")
        assert texts[1:] == [EXPIRED]  # told once; the stale answer never shown
        rows = await app.store._all("SELECT kind, state FROM outbox ORDER BY id")
        assert [tuple(r) for r in rows] == [("answer", "expired"), ("notice", "delivered")]


async def test_a_full_queue_refuses_at_once_a_question_whose_person_waits_on_an_answer(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """The radio's queue is full (``outbox_limit`` 2, 30 s spacing, two answers waiting) and
    Alice's worker waits on her first answer's slow ACK: her second question is refused at
    once ("Busy ... try again", stored ``limited``), in her notice lane. Before, it waited
    behind her first answer, and the refusal came only after that answer's delivery."""
    fake_llm.reply_fn = _tagged
    async with (
        mesh_harness(start=False, spacing_seconds=30.0, outbox_limit=2) as h,
        _app(tmp_path, fake_llm, h, "") as app,
    ):
        hold_clock_while_busy(h, app)
        # Virtual time stands still until q3 reached the responder: the queue stays full.
        handled = asyncio.Event()
        original = h.transport._on_message
        assert original is not None

        async def on_message(inbound: Inbound) -> None:
            await original(inbound)
            if inbound.text.startswith("q3"):
                handled.set()

        h.transport._on_message = on_message
        h.clock.settle_hooks.append(lambda: not handled.is_set())
        h.radio.routing = lambda packet, attempt: Later("NONE", delay=90.0)
        asked = h.clock.monotonic()
        h.radio.inject_text("q1 weather?", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "Alice's answer on air")
        for i, node in enumerate(PEOPLE[:2]):  # their answers wait: the queue is full
            h.radio.inject_text(f"q{10 + i} tides?", frm=node)
        waiting = {node_id(n) for n in PEOPLE[:2]}  # both queued, Alice's answer started

        def full() -> bool:
            jobs = {j.person for j in h.transport._jobs if not j.started}
            return jobs == waiting and h.transport.busy() is not None

        await h.until(full, "the queue is full")
        assert h.clock.monotonic() == asked
        h.radio.inject_text("q3 wind?", frm=ALICE)
        await h.until(
            lambda: any(text.startswith("Busy") for _, text in _shown(h, ALICE)), "refused"
        )
        [told] = [t for t, text in _shown(h, ALICE) if text.startswith("Busy")]
        assert told - asked <= 35.0  # the next packet slot, not after the first answer's ACK
        await app.responder.wait_idle()
        rows = await app.store._all("SELECT text, status FROM messages WHERE role = 'user'")
        assert ("q3 wind?", "limited") in [tuple(r) for r in rows]
        assert len(fake_llm.chat_requests()) == 3  # q3 never reached the model
