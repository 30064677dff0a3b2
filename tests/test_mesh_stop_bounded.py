"""A stop is not held by a reply that cannot go out (issue 18: the final SIGTERM of the crash
harness once took over 30 s).

The real transport and the unmodified library against the fake radio, on the virtual clock.
Before the fix, a cancel at stop waited for the part being sent *including* its wait for a link
(up to ``queue_wait``, 600 s by default) or for the pacer (a busy channel: up to
``busy_max_wait``); the virtual clock then ran on to that deadline. Now a stop waits only for a
part already being written; the reply ends PENDING (the durable outbox keeps it). Durations
here are virtual time (deterministic), not wall-clock.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.domain import DeliveryStatus, Inbound, Reply
from bot.transports.mesh_rules import node_id
from tests.fakes.fake_radio import ALICE
from tests.fakes.mesh_harness import Harness, mesh_harness

LONG = " ".join(f"Sentence {i} of a reply long enough for three parts." for i in range(9))


async def _link_down(h: Harness) -> None:
    await h.server_gone()  # the node reboots: reconnects are refused until it is back


async def _channel_busy(h: Harness) -> None:
    h.radio.inject_channel_utilization(40.0)  # other nodes alone fill the channel: hold
    await h.until(lambda: (h.transport._pacer.metrics.channel_utilization or 0) > 30, "spike")


@pytest.mark.parametrize("blocked", [_link_down, _channel_busy], ids=["link down", "busy"])
async def test_stop_does_not_wait_for_a_reply_that_cannot_go_out(blocked: object) -> None:
    async with mesh_harness(
        spacing_seconds=3.0, busy_threshold=20.0, busy_max_wait=600, queue_wait=600
    ) as h:
        await blocked(h)  # type: ignore[operator]
        reply = Reply(
            inbound=Inbound(transport="meshtastic", sender=node_id(ALICE), text="q"),
            text=h.transport.fit(LONG),
        )
        task = asyncio.ensure_future(h.transport.send(reply))
        await h.clock.sleep(20)  # the sender is waiting (link / pacer), nothing is on air
        assert h.radio.sent_texts() == [] and not task.done()
        before = h.clock.monotonic()
        await h.transport.stop()
        waited = h.clock.monotonic() - before
        delivery = await task
        assert delivery.status is DeliveryStatus.PENDING  # kept for the next run, not lost
        assert h.radio.sent_texts() == []
        # Before the fix: ~580 s (the link wait or the hold ran to its deadline).
        assert waited < 10, f"stop waited {waited:.0f} s of virtual time"


async def test_stop_lets_a_part_being_written_finish_and_be_recorded() -> None:
    recorded: list[tuple[int, str]] = []

    async def progress(index: int, pid: str) -> None:
        recorded.append((index, pid))

    async with mesh_harness(spacing_seconds=3.0) as h:
        reply = Reply(
            inbound=Inbound(transport="meshtastic", sender=node_id(ALICE), text="q"),
            text=h.transport.fit(LONG),
            progress=progress,
        )
        task = asyncio.ensure_future(h.transport.send(reply))
        await h.until(lambda: len(h.radio.sent_texts()) >= 1, "the first part on air")
        await h.transport.stop()
        delivery = await task
        assert delivery.status is DeliveryStatus.PENDING
        on_air = len(h.radio.sent_texts())
        assert 1 <= on_air < 3  # stopped between parts, not after the whole reply
        # every part the radio took was recorded before the stop completed
        assert [i for i, _ in recorded] == list(range(on_air))
