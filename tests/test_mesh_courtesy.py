"""Airtime courtesy on a shared channel: the real transport and the unmodified library against
the fake radio, which reports device metrics computed from what is on air (its own packets'
LoRa time on air + ``others_util``, other nodes' traffic), on the virtual clock; with the real
app (responder, SQLite outbox, fake LLM over HTTP) where the outbox matters."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import pytest

from bot.delivery import EXPIRED
from bot.domain import DeliveryStatus, Inbound, Reply
from bot.memory.store import SqliteStore
from bot.transports.mesh_airtime import lora_airtime
from bot.transports.mesh_rules import node_id
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE
from tests.fakes.mesh_harness import mesh_harness
from tests.test_meshtastic_app import running_app

PEOPLE = [0xA0000001 + i for i in range(6)]
LONG = " ".join(f"Sentence {i} of a reply long enough for three parts." for i in range(9))


def _share(times_and_airtimes: list[tuple[float, float]], start: float, end: float) -> float:
    return 100.0 * sum(a for t, a in times_and_airtimes if start <= t < end) / (end - start)


async def test_the_bot_keeps_its_share_of_the_channel_under_the_limit() -> None:
    async with mesh_harness(spacing_seconds=3.0, busy_threshold=20.0) as h:
        replies = [
            Reply(
                inbound=Inbound(transport="meshtastic", sender=node_id(n), text="q"),
                text=h.transport.fit(LONG),
            )
            for n in PEOPLE
        ]
        deliveries = await asyncio.gather(*(h.transport.send(r) for r in replies))
        assert [d.status for d in deliveries] == [DeliveryStatus.DELIVERED] * len(PEOPLE)
        sent = [(t, lora_airtime(len(p.decoded.payload))) for t, p in h.radio.sent_texts()]
        assert len(sent) == 3 * len(PEOPLE)
        start, end = sent[0][0], sent[-1][0] + sent[-1][1]
        assert _share(sent, start, end) <= 20.0  # spacing alone (3 s) would give ~55%
        # and in every minute the radio measured: its own report never went above the limit
        for t, _ in sent:
            assert _share(sent, t - 60.0, t) <= 20.0 + 100 * max(a for _, a in sent) / 60
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(sent)]
        assert min(gaps) >= 3.0 and max(gaps) > 3.0 * 2  # longer spacing than configured


async def test_a_spike_from_other_nodes_holds_the_backlog_then_it_goes_out() -> None:
    async with mesh_harness(spacing_seconds=3.0, busy_threshold=20.0, busy_max_wait=600) as h:
        h.radio.inject_channel_utilization(35.0)  # others alone fill the channel
        await h.until(lambda: (h.transport._pacer.metrics.channel_utilization or 0) > 30, "spike")
        reply = Reply(
            inbound=Inbound(transport="meshtastic", sender=node_id(ALICE), text="q"),
            text=h.transport.fit("The answer."),
        )
        t0 = h.clock.monotonic()
        task = asyncio.ensure_future(h.transport.send(reply))
        await h.clock.sleep(120)
        assert h.radio.sent_texts() == []  # held: nothing on air during the spike
        busy = h.transport.busy_for()
        assert busy is not None and busy >= 60  # a new question would hear "try again in N"
        h.radio.inject_channel_utilization(5.0)
        assert (await task).status is DeliveryStatus.DELIVERED
        assert h.radio.sent_texts()[0][0] - t0 >= 120
        assert h.transport.busy_for() is None


async def test_a_reply_held_too_long_waits_in_the_outbox_and_max_age_still_applies(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Held, then sent."
    fake_llm.script = [("sleep", 1.0)]  # the spike is reported while the model writes
    async with (
        mesh_harness(
            start=False, spacing_seconds=3.0, busy_max_wait=60, busy_poll=10, metrics_every=60
        ) as h,
        running_app(tmp_path, fake_llm, h, clock=h.clock.monotonic) as app,
    ):
        h.radio.inject_text("first", frm=ALICE)
        await h.until(lambda: len(fake_llm.chat_requests()) == 1, "the LLM call")
        h.radio.inject_channel_utilization(35.0)  # spike while the answer waits to go out
        await h.until(lambda: (h.transport._pacer.metrics.channel_utilization or 0) > 30, "spike")
        await h.until(lambda: len(h.radio.sent_texts()) >= 1 or not h.transport._jobs, "held")
        await app.responder.wait_idle()
        store = app.store
        assert isinstance(store, SqliteStore)
        rows = [tuple(r) for r in await store._all("SELECT state, claimed_by FROM outbox")]
        assert h.radio.sent_texts() == []
        assert rows == [("pending", None)]  # kept, claim given back for the next round
        assert await app.responder.redeliver() == 1  # still held: the round finds it again
        await h.until(lambda: not h.transport._jobs, "held again, back to the outbox")
        await app.responder.wait_idle()
        await h.clock.sleep(7200)  # two hours in the outbox (the monotonic clock ages rows)
        await h.until(lambda: not h.transport._jobs, "back in the outbox")
        await app.responder.wait_idle()
        h.radio.inject_channel_utilization(0.0)
        for _ in range(3):  # rounds once the channel is free
            await app.responder.redeliver()
            await app.responder.wait_idle()
        assert h.radio.texts() == [EXPIRED]  # too old: expired, never sent; told once
        rows = [tuple(r) for r in await store._all("SELECT kind, state, text FROM outbox")]
        assert rows[0] == ("answer", "expired", "Held, then sent.")
        assert [r[0] for r in rows] == ["answer", "notice"]
        assert await app.responder.redeliver() == 0


async def test_a_radio_without_device_metrics_paces_by_spacing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bot.transport.meshtastic")
    async with mesh_harness(spacing_seconds=3.0, metrics=False) as h:
        replies = [
            Reply(
                inbound=Inbound(transport="meshtastic", sender=node_id(n), text="q"),
                text=h.transport.fit(LONG),
            )
            for n in PEOPLE[:2]
        ]
        await asyncio.gather(*(h.transport.send(r) for r in replies))
        times = [t for t, _ in h.radio.sent_texts()]
        assert [round(b - a, 3) for a, b in itertools.pairwise(times)] == [3.0] * 5
    said = [r.getMessage() for r in caplog.records if "no device metrics" in r.getMessage()]
    assert len(said) == 1 and "spacing_seconds" in said[0]


async def test_a_person_asking_during_a_spike_is_told_and_answered_when_room_returns(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Sunny tomorrow."
    async with (
        mesh_harness(start=False, spacing_seconds=3.0, metrics_every=60, busy_max_wait=600) as h,
        running_app(tmp_path, fake_llm, h) as app,
    ):
        h.radio.inject_channel_utilization(22.0)  # over our 20%, under the firmware's 25%
        await h.until(lambda: (h.transport._pacer.metrics.channel_utilization or 0) > 21, "spike")
        h.radio.inject_text("weather?", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the notice")
        [(_, packet)] = h.radio.sent_texts()
        text = packet.decoded.payload.decode()
        assert text.startswith("Channel busy") and "answer is saved" in text
        await h.until(lambda: len(fake_llm.chat_requests()) == 1, "the answer is written now")
        await h.clock.sleep(300)
        assert len(h.radio.sent_texts()) == 1  # held while the channel stays full
        h.radio.inject_channel_utilization(2.0)
        await h.until(lambda: len(h.radio.sent_texts()) == 2, "the answer once room returns")
        await app.responder.wait_idle()
        assert h.radio.texts()[1] == "Sunny tomorrow."
        rows = await app.store._all("SELECT kind, state FROM outbox ORDER BY id")
        assert [tuple(r) for r in rows] == [("answer", "delivered")]
