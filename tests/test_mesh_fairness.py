"""Fair sending on a shared, slow radio: the real transport and the unmodified library against
the fake radio on the virtual clock, with unkind ACK behaviour (delayed, relay-only, never,
NAK reasons). Time is measured on the radio's (fake) clock, never on the wall clock."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from bot.domain import Delivery, DeliveryStatus, Inbound, Reply
from bot.transports.mesh_rules import node_id
from tests.fakes.fake_radio import ALICE, Later
from tests.fakes.mesh_harness import Harness, mesh_harness

SPACING = 3.0
PEOPLE = [0xA0000001 + i for i in range(6)]
DEAD = PEOPLE[0]
LONG = " ".join(f"Sentence {i} of a reply long enough for three parts." for i in range(9))


def _inbound(num: int) -> Inbound:
    return Inbound(transport="meshtastic", sender=node_id(num), text="q", message_id=None)


async def _send_all(h: Harness, people: list[int], text: str = LONG) -> list[Delivery]:
    tasks = []
    for num in people:  # one reply each, all waiting at once
        reply = Reply(inbound=_inbound(num), text=h.transport.fit(text))
        tasks.append(asyncio.ensure_future(h.transport.send(reply)))
        await asyncio.sleep(0)
    return list(await asyncio.gather(*tasks))


def _first_part_at(h: Harness) -> dict[int, float]:
    first: dict[int, float] = {}
    for t, packet in h.radio.sent_texts():
        first.setdefault(packet.to, t)
    return first


async def _run(routing: Any, **settings: Any) -> tuple[list[Delivery], Harness]:
    # Fairness is about order and spacing: a radio without device metrics keeps the channel
    # rule (tests/test_mesh_courtesy.py) out of these timings.
    async with mesh_harness(spacing_seconds=SPACING, metrics=False, **settings) as h:
        h.radio.routing = routing
        deliveries = await _send_all(h, PEOPLE)
        return deliveries, h


async def test_a_node_that_never_acks_delays_the_others_by_at_most_one_reply() -> None:
    healthy, base = await _run(lambda p, attempt: "NONE")
    dead, hurt = await _run(lambda p, attempt: None if p.to == DEAD else "NONE")
    assert [d.status for d in healthy] == [DeliveryStatus.DELIVERED] * len(PEOPLE)
    assert dead[0].status is DeliveryStatus.FAILED
    assert [d.status for d in dead[1:]] == [DeliveryStatus.DELIVERED] * (len(PEOPLE) - 1)
    one_reply = 3 * SPACING  # three parts, paced
    t0_base, t0_hurt = base.radio.sent_texts()[0][0], hurt.radio.sent_texts()[0][0]
    for num in PEOPLE[1:]:
        waited_base = _first_part_at(base)[num] - t0_base
        waited_hurt = _first_part_at(hurt)[num] - t0_hurt
        assert waited_hurt - waited_base <= one_reply, (node_id(num), waited_base, waited_hurt)
    # its re-send burst went out between other people's replies, never inside one
    assert _bursts_are_whole(hurt)


def _bursts_are_whole(h: Harness) -> bool:
    """Parts (1/n)..(n/n) of one reply are never split by someone else's packet."""
    dests = [(p.to, p.decoded.payload.decode()[:5]) for _, p in h.radio.sent_texts()]
    i = 0
    while i < len(dests):
        to, prefix = dests[i]
        n = int(prefix[3]) if prefix.startswith("(") else 1
        start = int(prefix[1]) if prefix.startswith("(") else 1
        run = dests[i : i + 1]
        j = i + 1
        while j < len(dests) and dests[j][0] == to and int(dests[j][1][1]) > int(run[-1][1][1]):
            run.append(dests[j])
            j += 1
        if start == 1 and len(run) != n:
            return False
        i = j
    return True


async def test_waiting_for_slow_acks_does_not_hold_the_radio() -> None:
    deliveries, h = await _run(lambda p, attempt: Later("NONE", delay=90.0), ack_timeout=120.0)
    assert [d.status for d in deliveries] == [DeliveryStatus.DELIVERED] * len(PEOPLE)
    times = [t for t, _ in h.radio.sent_texts()]
    assert len(times) == 3 * len(PEOPLE)  # nothing re-sent
    # back to back: the last person's last part left before the first ACK came
    assert times[-1] - times[0] < 90.0
    assert all(b - a < SPACING + 1 for a, b in itertools.pairwise(times))


async def test_a_relay_only_ack_is_sent_not_resent() -> None:
    relay = 0xCAFE0001
    deliveries, h = await _run(lambda p, attempt: Later("NONE", delay=5.0, frm=relay))
    assert {d.status for d in deliveries} == {DeliveryStatus.SENT}
    assert len(h.radio.sent_texts()) == 3 * len(PEOPLE)


async def test_nak_reasons_a_resend_cannot_fix_fail_at_once() -> None:
    async with mesh_harness(spacing_seconds=SPACING) as h:
        h.radio.routing = lambda p, attempt: "NO_CHANNEL"
        [delivery] = await _send_all(h, [PEOPLE[1]], "Short.")
        assert delivery.status is DeliveryStatus.FAILED and "NO_CHANNEL" in (delivery.detail or "")
        assert len(h.radio.sent_texts()) == 1


async def test_an_unreachable_node_costs_at_most_the_airtime_budget() -> None:
    async with mesh_harness(spacing_seconds=SPACING, ack_retries=5) as h:
        h.radio.routing = lambda p, attempt: Later("MAX_RETRANSMIT", delay=20.0)
        # Alice: in the radio's node DB (a node it never heard of gets no re-sends at all:
        # tests/test_mesh_strangers.py)
        [delivery] = await _send_all(h, [ALICE])
        assert delivery.status is DeliveryStatus.FAILED and "budget" in (delivery.detail or "")
        # 3 parts, each costing 1 write + 3 firmware retransmissions: 24 allows one re-send
        assert len(h.radio.sent_texts()) == 6


async def test_done_parts_are_skipped_and_progress_is_reported_per_part() -> None:
    recorded: list[tuple[int, str]] = []

    async def progress(part: int, pid: str) -> None:
        recorded.append((part, pid))

    async with mesh_harness(spacing_seconds=SPACING) as h:
        text = h.transport.fit(LONG)
        reply = Reply(inbound=_inbound(PEOPLE[2]), text=text, done_parts=frozenset({0}),
                      progress=progress)  # fmt: skip
        delivery = await h.transport.send(reply)
        assert delivery.status is DeliveryStatus.SENT  # part 1 went out in an earlier run
        on_air = [p.decoded.payload.decode()[:5] for _, p in h.radio.sent_texts()]
        assert on_air == ["(2/3)", "(3/3)"]
        assert [i for i, _ in recorded] == [1, 2]
        assert [pid for _, pid in recorded] == [str(p.id) for _, p in h.radio.sent_texts()]
