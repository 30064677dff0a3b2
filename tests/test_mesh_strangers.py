"""Forged strangers cannot spend the bot's airtime (issue 44.8): the real transport and the
unmodified library against the fake radio on the virtual clock. A ghost is a node id no radio
has (a forged ``from``): nobody ACKs a DM to it and the local firmware reports MAX_RETRANSMIT
after its own three retransmissions. Airtime is measured on what the radio received."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app import App, build
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply, ReplyKind
from bot.transports.mesh_airtime import HOUR, lora_airtime
from bot.transports.mesh_rules import node_id
from bot.transports.mesh_strangers import (
    STRANGER_WAIT,
    Allowance,
    Standing,
    known_node,
    rank,
    standing,
)
from bot.web.prom import exposition
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE, GHOST_GIVE_UP, Later
from tests.fakes.mesh_harness import Harness, hold_clock_while_busy, mesh_harness
from tests.test_web_security import snapshot

GHOSTS = [0xF0000001 + i for i in range(30)]
FIRMWARE_RETRIES = 3
ANSWER = "Rain later today, about 5 mm; take a jacket if you go out this afternoon."
# the EU duty cycle (10%) and the default stranger_share (25%): 90 s on air an hour
ALLOWANCE = HOUR * 0.10 * 0.25


def _inbound(num: int) -> Inbound:
    return Inbound(transport="meshtastic", sender=node_id(num), text="q", message_id=None)


async def _reply_all(h: Harness, nums: list[int], text: str = ANSWER) -> list[Delivery]:
    tasks = []
    for num in nums:  # every reply waiting at once, in this order
        reply = Reply(inbound=_inbound(num), text=h.transport.fit(text))
        tasks.append(asyncio.ensure_future(h.transport.send(reply)))
        await asyncio.sleep(0)
    return list(await asyncio.gather(*tasks))


def _on_air(h: Harness, nums: list[int]) -> float:
    """Seconds on air of the writes to ``nums`` (never ACKed: each also retransmitted 3x)."""
    return sum(
        lora_airtime(len(p.decoded.payload)) * (1 + FIRMWARE_RETRIES)
        for _, p in h.radio.sent_texts()
        if p.to in set(nums)
    )


def test_standing_and_the_node_db() -> None:
    # keys are pinned on first use: a flood can mint one per invented id, so only an ACK confirms
    assert standing(authenticated=True, acked=False, known=False) is Standing.KNOWN
    assert standing(authenticated=False, acked=True, known=False) is Standing.CONFIRMED
    assert standing(authenticated=False, acked=False, known=True) is Standing.KNOWN
    assert standing(authenticated=False, acked=False, known=False) is Standing.STRANGER
    num = 0xF0000001
    placeholder = {"user": {"longName": "Meshtastic 0001"}}  # the library's entry for a node
    assert not known_node({num: placeholder}, num)  # it only heard a packet of
    assert not known_node({}, num) and not known_node(None, num)
    assert known_node({num: {"user": {"longName": "Alice"}}}, num)
    assert known_node({num: {"user": {"longName": "Meshtastic 0001", "publicKey": "k"}}}, num)


def test_the_allowance_ages_out_and_adds_retransmissions() -> None:
    allowance = Allowance(seconds_per_hour=10.0)
    token = allowance.charge(0.0, 2.0)
    allowance.add(token, 6.0)
    assert allowance.used(10.0) == 8.0 and not allowance.covers(10.0, 2.5)
    assert allowance.covers(HOUR + 1.0, 10.0)  # the hour forgot it


async def test_the_fake_radio_answers_max_retransmit_for_a_node_that_does_not_exist() -> None:
    async with mesh_harness(spacing_seconds=3.0) as h:
        h.radio.ghosts.add(GHOSTS[0])
        sent = h.clock.monotonic()
        [delivery] = await _reply_all(h, [GHOSTS[0]], "Hi.")
        assert delivery.status is DeliveryStatus.FAILED
        assert "MAX_RETRANSMIT" in (delivery.detail or "")
        assert not h.radio.shown  # nobody displayed it
        assert h.clock.monotonic() - sent >= GHOST_GIVE_UP  # after the firmware's retries


async def test_a_forged_stranger_gets_one_write_and_no_resends() -> None:
    """Before: 1 + ack_retries (2) writes, each retransmitted 3x by the firmware."""
    async with mesh_harness(spacing_seconds=3.0) as h:
        h.radio.forge_text("what is the weather?", frm=GHOSTS[0])
        await h.message()
        [delivery] = await _reply_all(h, [GHOSTS[0]])
        assert len(h.radio.sent_texts()) == 1
        assert delivery.status is DeliveryStatus.FAILED
        assert "no re-send" in (delivery.detail or "")


async def test_a_known_person_still_gets_resends() -> None:
    async with mesh_harness(spacing_seconds=3.0) as h:
        h.radio.routing = lambda p, attempt: "MAX_RETRANSMIT" if attempt == 0 else "NONE"
        [delivery] = await _reply_all(h, [ALICE], "Short.")
        assert delivery.status is DeliveryStatus.DELIVERED
        assert len(h.radio.sent_texts()) == 2


async def test_a_flood_of_forged_strangers_costs_at_most_their_share_of_the_hour(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """30 forged DMs: before, 90 writes (~340 s on air, 95% of the EU hour); now at most the
    allowance plus the retransmissions of the writes still waiting when it was reached."""
    caplog.set_level(logging.INFO, logger="bot.transport.meshtastic")
    async with mesh_harness(spacing_seconds=3.0) as h:
        h.radio.ghosts.update(GHOSTS)
        deliveries = await _reply_all(h, GHOSTS)
        writes = [p for _, p in h.radio.sent_texts() if p.to in set(GHOSTS)]
        one = lora_airtime(len(writes[0].decoded.payload))
        in_flight = GHOST_GIVE_UP / 3.0 + 1  # writes whose MAX_RETRANSMIT had not come yet
        assert _on_air(h, GHOSTS) <= ALLOWANCE + in_flight * FIRMWARE_RETRIES * one
        assert len(writes) == len({p.to for p in writes}) < len(GHOSTS)  # one each, some none
        refused = [d for d in deliveries if "unconfirmed senders" in (d.detail or "")]
        assert len(refused) == len(GHOSTS) - len(writes)
        assert all(d.status is DeliveryStatus.FAILED for d in deliveries)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and
                    "unconfirmed senders" in r.getMessage()]  # fmt: skip
        assert len(warnings) == 1  # once per episode, not per refused reply
        view = h.transport.mesh_view()  # the operator's view (web page, /metrics)
        assert view.strangers_refused == len(refused) > 0
        assert view.stranger_allowance == ALLOWANCE
        assert 0 < view.stranger_airtime <= _on_air(h, GHOSTS) + 1e-6
        snap = snapshot()
        assert snap.mesh is not None
        mesh = dataclasses.replace(snap.mesh, strangers_refused=len(refused))
        text = exposition(dataclasses.replace(snap, mesh=mesh))
        assert f"meshsage_mesh_strangers_refused_total {len(refused)}" in text


async def test_notices_to_strangers_are_charged_too_and_never_spam() -> None:
    async with mesh_harness(spacing_seconds=3.0, stranger_share=1.0) as h:  # 3.6 s an hour
        h.radio.ghosts.update(GHOSTS)
        tasks = []
        for num in GHOSTS[:5]:
            notice = Reply(inbound=_inbound(num), text="Busy. Try again in 2 min.",
                           kind=ReplyKind.NOTICE)  # fmt: skip
            tasks.append(asyncio.ensure_future(h.transport.send(notice)))
        deliveries = await asyncio.gather(*tasks)
        # one notice at its worst is 4 x 0.7 s: two fit 3.6 s (the first one's retransmissions
        # were not known yet when the second went), the other three are not sent
        assert len(h.radio.sent_texts()) == 2
        refused = [d for d in deliveries if "unconfirmed senders" in (d.detail or "")]
        assert len(refused) == 3 and {d.status for d in deliveries} == {DeliveryStatus.FAILED}


async def test_known_people_are_served_before_strangers() -> None:
    """Before: in arrival order, Alice's answer went out after every forged one."""
    async with mesh_harness(spacing_seconds=3.0) as h:
        h.radio.ghosts.update(GHOSTS[:6])
        await _reply_all(h, [*GHOSTS[:6], ALICE])
        order = [p.to for _, p in h.radio.sent_texts()]
        assert order.index(ALICE) <= 1  # at most the one write already chosen goes first


async def test_a_node_that_acked_is_confirmed_and_costs_the_allowance_nothing() -> None:
    newcomer = 0xC0FFEE01  # not in the node DB, but its radio exists and ACKs
    async with mesh_harness(spacing_seconds=3.0) as h:
        strangers = h.transport._strangers
        h.radio.routing = lambda p, attempt: Later("NONE", delay=10.0)
        task = asyncio.ensure_future(_reply_all(h, [newcomer], "Hello there."))
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the first write")
        assert strangers.allowance.used(h.clock.monotonic()) > 0  # charged while unanswered
        await task
        assert strangers.allowance.used(h.clock.monotonic()) == 0  # the ACK forgave it
        assert strangers.acked(newcomer)
        h.radio.routing = lambda p, attempt: "MAX_RETRANSMIT" if attempt <= 1 else "NONE"
        [delivery] = await _reply_all(h, [newcomer], "Hello again.")
        assert delivery.status is DeliveryStatus.DELIVERED  # re-sent as for anyone known
        assert strangers.allowance.used(h.clock.monotonic()) == 0


def test_a_strangers_reply_waits_behind_the_others_only_for_a_while() -> None:
    assert rank(Standing.STRANGER, 0.0) > rank(Standing.KNOWN, 0.0) == 0
    assert rank(Standing.STRANGER, STRANGER_WAIT) == rank(Standing.CONFIRMED, 0.0)


async def test_refused_strangers_do_not_fill_the_queue() -> None:
    """Replies to strangers the allowance no longer covers end without airtime: they never
    make a known person's question "busy, try again"."""
    async with mesh_harness(spacing_seconds=3.0, outbox_limit=3, stranger_share=2.0) as h:
        h.radio.ghosts.update(GHOSTS)
        h.radio.routing = lambda p, attempt: Later("NONE", delay=GHOST_GIVE_UP)
        tasks = [
            asyncio.ensure_future(h.transport.send(Reply(inbound=_inbound(n), text=ANSWER)))
            for n in GHOSTS[:10]
        ]
        await h.until(lambda: len(h.transport._jobs) == 10, "ten replies queued")
        assert h.transport.busy() is None
        await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def _app(tmp_path: Path, llm: FakeLLM, h: Harness) -> AsyncIterator[App]:
    extra = "bot:\n  rate_limit: {messages: 1000, per_seconds: 60}\n"
    config = make_config(tmp_path, llm.base_url, extra)
    app = await build(config, env={}, transports=[h.transport], clock=h.clock.monotonic)
    try:
        await app.start()
        await h.connected()
        yield app
    finally:
        await app.close()


async def test_a_real_person_asking_after_a_flood_is_answered_at_once(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """The issue's case through the whole app: 30 forged DMs, then Alice asks 60 s later.
    Before, she was told "Busy ... try again" and never answered; now her answer is the next
    packet on air."""
    fake_llm.reply = ANSWER
    async with (
        mesh_harness(start=False, spacing_seconds=3.0) as h,
        _app(tmp_path, fake_llm, h) as app,
    ):
        hold_clock_while_busy(h, app)
        for num in GHOSTS:
            h.radio.forge_text("what is the weather tomorrow?", frm=num)
        await h.clock.sleep(60.0)
        asked = h.clock.monotonic()
        h.radio.inject_text("will it rain at my place?", frm=ALICE)
        await h.until(lambda: any(p.to == ALICE for _, p in h.radio.sent_texts()), "Alice")
        [(first, packet)] = [(t, p) for t, p in h.radio.sent_texts() if p.to == ALICE][:1]
        assert packet.decoded.payload.decode() == ANSWER
        assert first - asked <= 3.0 + 1.0  # one spacing (and a crumb)
        assert _on_air(h, GHOSTS) <= 0.35 * HOUR * 0.10  # the share plus in-flight retries
