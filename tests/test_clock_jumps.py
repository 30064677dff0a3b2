"""A Raspberry Pi has no real-time clock: it boots at the last saved time and NTP steps it
later, or a bad source steps it back. No step loses, expires or deletes anything (issue 38's
first table, one test per row, forward and back, with and without retention).

The real app (responder, SQLite, the openai client over HTTP to the fake LLM); where the row
involves the radio, the real Meshtastic transport and the unmodified library against the fake
radio on its virtual clock. Every module's wall clock is stepped (``time.time`` patched), the
system's "synchronized" state comes from ``FakeSync``."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import App, build
from bot.clock import CLOCK_FILE, SETTLE_SECONDS, ClockWatch
from bot.delivery import EXPIRED
from bot.memory.store import USER
from bot.recovery import NOT_ANSWERED
from tests.conftest import Harness, make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_sync import FakeSync, SteppedWall
from tests.fakes.fake_transport import FakeTransport
from tests.fakes.mesh_harness import Harness as MeshHarness
from tests.fakes.mesh_harness import every, hold_clock_while_busy, mesh_harness

DAY = 86_400.0
PEOPLE = [0xC0000001 + i for i in range(6)]
TAG = re.compile(r"q\d+")
RETENTION = "memory:\n  retention_days: 2\n"


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> SteppedWall:
    stepped = SteppedWall()
    monkeypatch.setattr(time, "time", stepped)
    return stepped


def _tagged(body: dict[str, Any]) -> str:
    return f"Answer {TAG.findall(str(body['messages'][-1]['content']))[-1]}."


# --- row 1: answers queued behind a hold ----------------------------------------------------------
@contextlib.asynccontextmanager
async def _held(
    tmp_path: Path, llm: FakeLLM, wall: SteppedWall, sync: FakeSync
) -> AsyncIterator[tuple[MeshHarness, App]]:
    """The app on a radio whose node reports its hour over the duty cycle: answers wait."""
    llm.reply_fn = _tagged
    async with mesh_harness(start=False, spacing_seconds=3.0, metrics_every=60) as h:
        config = make_config(tmp_path, llm.base_url)
        app = await build(
            config, env={}, transports=[h.transport], clock=h.clock.monotonic, wall=wall, sync=sync
        )
        try:
            await app.start()
            await h.connected()
            async with every(h.clock, 10.0, app.responder.redeliver):
                hold_clock_while_busy(h, app)
                h.radio.air_util_tx = 12.0
                h.radio.report_metrics()
                await h.until(lambda: h.transport.busy() is not None, "the hold")
                yield h, app
        finally:
            await app.close()


async def _settled(h: MeshHarness, app: App) -> None:
    for _ in range(3000):
        rows = await app.store._all("SELECT count(*) FROM outbox WHERE state = 'pending'")
        if rows[0][0] == 0:
            return
        await h.clock.sleep(5)
    raise AssertionError("the outbox never emptied")


@pytest.mark.parametrize("step", [3 * DAY, -3 * DAY], ids=["forward", "back"])
async def test_a_step_while_six_answers_wait_behind_a_hold_expires_none(
    tmp_path: Path, fake_llm: FakeLLM, wall: SteppedWall, step: float
) -> None:
    """Before: +3 days expired 6 of 6 ("could not send my reply ... in time"): the outbox
    aged rows by the larger of their wall-clock and monotonic ages."""
    async with _held(tmp_path, fake_llm, wall, FakeSync(synchronized=True)) as (h, app):
        for i, node in enumerate(PEOPLE):
            h.radio.inject_text(f"q{i} weather?", frm=node)
        await h.until(lambda: len(fake_llm.chat_requests()) == len(PEOPLE), "six answers")
        wall.step(step)  # NTP steps the Pi's clock while the answers wait
        t0 = h.clock.monotonic()
        while h.clock.monotonic() < t0 + 300:
            await h.clock.sleep(30)
        h.radio.air_util_tx = 1.0  # the hour frees room
        await _settled(h, app)
        for i, node in enumerate(PEOPLE):
            texts = [p.decoded.payload.decode() for _, p in h.radio.shown if p.to == node]
            assert texts == [f"Answer q{i}."]
        rows = await app.store._all("SELECT kind, state FROM outbox ORDER BY id")
        assert [tuple(r) for r in rows] == [("answer", "delivered")] * len(PEOPLE)
        assert EXPIRED not in [p.decoded.payload.decode() for _, p in h.radio.shown]


# --- rows 2 and 3: retention ----------------------------------------------------------------------
async def _app(
    tmp_path: Path, llm: FakeLLM, wall: SteppedWall, sync: FakeSync, extra: str
) -> Harness:
    config = make_config(tmp_path, llm.base_url, extra)
    app = await build(config, env={}, transports=[FakeTransport()], wall=wall, sync=sync)
    await app.start()
    assert isinstance(app.transports[0], FakeTransport)
    return Harness(app, app.transports[0], llm)


async def _messages(h: Harness) -> int:
    return int((await h.store._all("SELECT count(*) FROM messages"))[0][0])


async def _talk(h: Harness, n: int = 6) -> None:
    for i in range(n):
        await h.say(f"q{i} note number {i} about the boat")


def _prompt(llm: FakeLLM) -> str:
    return "\n".join(str(m["content"]) for m in llm.chat_requests()[-1]["messages"])


@pytest.mark.parametrize("synced", [True, None], ids=["synchronized", "system-silent"])
@pytest.mark.parametrize("extra", [RETENTION, ""], ids=["retention", "no-retention"])
@pytest.mark.parametrize("step", [3 * DAY, -3 * DAY], ids=["forward", "back"])
async def test_a_step_after_twelve_messages_deletes_none_of_them(
    tmp_path: Path,
    fake_llm: FakeLLM,
    wall: SteppedWall,
    step: float,
    extra: str,
    synced: bool | None,
) -> None:
    """Before: +3 days with ``retention_days: 2`` deleted the 12 minutes-old messages at once,
    and the next prompt held none of them. With a synchronized system the new clock is right
    and the messages' dates are read corrected; with a silent one nothing is pruned yet."""
    fake_llm.reply_fn = _tagged
    h = await _app(tmp_path, fake_llm, wall, FakeSync(synchronized=synced), extra)
    try:
        await _talk(h)
        assert await _messages(h) == 12
        wall.step(step)
        await h.app.trust.refresh()
        assert await h.app.retention() == 0  # what the maintenance loop runs
        assert await _messages(h) == 12
        await h.say("q9 what did I note?")
        assert all(f"note number {i}" in _prompt(fake_llm) for i in range(6))
    finally:
        await h.app.close()


async def test_a_step_across_a_restart_is_noticed_and_deletes_nothing(
    tmp_path: Path, fake_llm: FakeLLM, wall: SteppedWall
) -> None:
    """The bot stopped, NTP stepped the clock +3 days, the bot started again (same boot): the
    record the last run left (``clock.json``) shows the step, and the retention run at start
    keeps the 12 messages written on the old clock. A message truly older than the window
    (dated before any of it) still goes."""
    fake_llm.reply_fn = _tagged
    sync = FakeSync(synchronized=True)
    h = await _app(tmp_path, fake_llm, wall, sync, RETENTION)
    conv = await h.store.conversation(h.transport_key("old"))
    await h.store.add_message(
        conv.id, role=USER, author="old", text="old", tokens=1, status="answered",
        created_at=time.time() - 3 * DAY,
    )  # fmt: skip
    await _talk(h)
    await h.app.close()  # (retention at the first start deleted nothing yet: see below)
    assert (tmp_path / "state" / CLOCK_FILE).is_file()
    wall.step(3 * DAY)
    h = await _app(tmp_path, fake_llm, wall, sync, RETENTION)
    try:
        await h.app.retention()
        rows = await h.store._all("SELECT text FROM messages WHERE role = 'user' ORDER BY id")
        assert [r[0] for r in rows] == [f"q{i} note number {i} about the boat" for i in range(6)]
    finally:
        await h.app.close()


async def test_back_three_days_then_forward_again_keeps_what_was_written_meanwhile(
    tmp_path: Path, fake_llm: FakeLLM, wall: SteppedWall
) -> None:
    """Before: a bad source stepped the clock back 3 days, the correction stepped it forward,
    and retention (2 days) deleted the 12 messages stored while the clock was behind."""
    fake_llm.reply_fn = _tagged
    h = await _app(tmp_path, fake_llm, wall, FakeSync(synchronized=True), RETENTION)
    try:
        wall.step(-3 * DAY)
        await h.app.trust.refresh()
        await _talk(h)
        wall.step(3 * DAY)
        await h.app.trust.refresh()
        assert await h.app.retention() == 0
        assert await _messages(h) == 12
    finally:
        await h.app.close()


# --- the restart path and the take-over -----------------------------------------------------------
async def test_questions_left_at_a_stop_are_answered_after_a_step_not_told_too_old(
    tmp_path: Path, fake_llm: FakeLLM, wall: SteppedWall
) -> None:
    """Before: questions stored on a clock 3 days behind, answered after a restart on the
    corrected clock, got "I was offline when you wrote 3 days ago" (``recovery._too_old``)."""
    fake_llm.reply_fn = _tagged
    sync = FakeSync(synchronized=True)
    h = await _app(tmp_path, fake_llm, wall, sync, "")
    h.transport.link_down = False
    conv = await h.store.conversation(h.transport_key("alice"))
    for i in range(3):
        await h.store.add_message(
            conv.id, role=USER, author="alice", text=f"q{i} left", tokens=2, status="pending"
        )
    await h.app.close()
    wall.step(3 * DAY)
    h = await _app(tmp_path, fake_llm, wall, sync, "")
    try:
        await h.app.responder.wait_idle()
        assert h.transport.texts() == ["Answer q0.", "Answer q1.", "Answer q2."]
        assert not any(t.startswith(NOT_ANSWERED[:20]) for t in h.transport.texts())
    finally:
        await h.app.close()


async def test_a_live_claim_is_not_taken_over_on_a_clock_just_stepped(
    tmp_path: Path, fake_llm: FakeLLM, wall: SteppedWall
) -> None:
    """Another gateway claimed a question a minute ago; the clock steps +10 min: the claim now
    looks stale on the wall clock. Before, the running gateway took it over at once (and
    both answered). While the clock is not trusted, nothing is taken over; once it is (the
    system vouches for it), the real rules apply."""
    fake_llm.reply_fn = _tagged
    sync = FakeSync(synchronized=None)
    h = await _app(tmp_path, fake_llm, wall, sync, "")
    try:
        conv = await h.store.conversation(h.transport_key("alice"))
        msg = await h.store.add_message(
            conv.id, role=USER, author="alice", text="q1 theirs", tokens=2, status="pending",
            created_at=time.time() - 60,
        )  # fmt: skip
        await h.store._exec(
            "UPDATE messages SET claimed_by = 'other', claimed_at = ? WHERE id = ?",
            (time.time() - 60, msg),
        )
        wall.step(600)
        assert not h.app.trust.trusted()
        assert await h.app.responder.take_over_stale() == 0
        assert h.transport.texts() == []
        sync.synchronized = True  # NTP made that step: the new clock is right
        await h.app.trust.refresh()
        assert h.app.trust.trusted()
        assert await h.app.responder.take_over_stale() == 1  # stale in truth now: 11 min
        await h.app.responder.wait_idle()
        assert h.transport.texts() == ["Answer q1."]
    finally:
        await h.app.close()


# --- the watch itself -----------------------------------------------------------------------------
async def test_trust_returns_after_the_settle_time_or_while_ntp_is_not_synchronized_yet(
    tmp_path: Path,
) -> None:
    now, mono = [1_000_000.0], [50.0]
    sync = FakeSync(synchronized=None)
    watch = ClockWatch(sync=sync, wall=lambda: now[0], mono=lambda: mono[0], boot_id="b")
    assert watch.trusted()
    now[0] += 3 * DAY  # a step
    assert not watch.trusted()
    mono[0] += SETTLE_SECONDS / 2
    now[0] += SETTLE_SECONDS / 2
    assert not watch.trusted()
    mono[0] += SETTLE_SECONDS
    now[0] += SETTLE_SECONDS
    assert watch.trusted()  # ran steady long enough
    assert watch.age(1_000_000.0) < SETTLE_SECONDS * 2  # a date from before: corrected
    # NTP active, not synchronized at start: wait (an offline Pi gives up after a while)
    waiting = ClockWatch(
        sync=FakeSync(synchronized=False, ntp_active=True), wall=lambda: now[0],
        mono=lambda: mono[0], boot_id="b",
    )  # fmt: skip
    await waiting.refresh()
    assert not waiting.trusted()
    mono[0] += 3600
    now[0] += 3600
    assert waiting.trusted()


def test_slew_over_days_between_runs_is_not_a_step(tmp_path: Path) -> None:
    now, mono = [1_000_000.0], [50.0]
    path = tmp_path / CLOCK_FILE
    ClockWatch(sync=FakeSync(), path=path, wall=lambda: now[0], mono=lambda: mono[0], boot_id="b")
    mono[0] += 3 * DAY
    now[0] += 3 * DAY + 100  # 390 ppm: NTP's slew, not a step
    later = ClockWatch(
        sync=FakeSync(), path=path, wall=lambda: now[0], mono=lambda: mono[0], boot_id="b"
    )
    assert later.trusted()
    now[0] += 3 * DAY  # another boot would not compare; this one does: a step
    third = ClockWatch(
        sync=FakeSync(), path=path, wall=lambda: now[0], mono=lambda: mono[0], boot_id="b"
    )
    assert not third.trusted()
