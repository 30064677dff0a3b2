"""Regression (issue 18, found by the crash harness's link-loss runs): a part the library
accepted on a TCP link it was silently re-opening never reached the radio, but was recorded as
written; the outbox row stayed pending (no ACK), and the next send of the row (after a
restart) skipped the part as done: the answer's end was lost. Now a DM part whose ACK nobody
saw is written again with its planned packet id: a receiver that has it drops the repeat, one
that has not shows it. A part ACKed in this run is not written again.

The real transport and the unmodified library against the fake radio, on the virtual clock;
the radio is frozen (reads, shows nothing, answers nothing) from the moment part 2 is planned.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.domain import DeliveryStatus, Reply
from tests.fakes.mesh_harness import mesh_harness

LONG = " ".join(f"Sentence {i} of a reply long enough for two parts." for i in range(5))


@pytest.mark.parametrize("restarted", [False, True], ids=["same run", "after a restart"])
async def test_a_written_part_that_never_reached_the_radio_is_sent_again(restarted: bool) -> None:
    async with mesh_harness(ack_timeout=600.0, ack_backoff=600.0) as h:
        h.radio.inject_text("question")
        inbound = await h.message()
        planned: dict[int, int] = {}
        recorded: dict[int, str] = {}
        part_two_written = asyncio.Event()

        async def plan(part: int, packet_id: int) -> int:
            if part == 1 and 1 not in planned:
                # part 1 reached the person first (the radio reads the stream on its own
                # thread: freezing before it read part 1 would lose that one instead)
                await h.until(lambda: len(h.radio.shown) == 1, "part 1 shown")
                h.radio.freeze()  # part 2 goes into a link that is already gone
            return planned.setdefault(part, packet_id)

        async def progress(part: int, platform_id: str) -> None:
            recorded[part] = platform_id
            if part == 1:
                part_two_written.set()

        text = h.transport.fit(LONG)
        reply = Reply(inbound=inbound, text=text, outbox_id=7, plan=plan, progress=progress)
        first = asyncio.ensure_future(h.transport.send(reply))
        await part_two_written.wait()
        first.cancel()  # the run ends (a stop): the row stays pending with both parts recorded
        with pytest.raises(asyncio.CancelledError):
            await first
        assert sorted(recorded) == [0, 1]
        await h.until(lambda: len(h.radio.sent_texts()) == 2, "part 2 read by the radio")
        assert [p.id for _, p in h.radio.shown] == [planned[0]]  # part 2 never arrived
        h.radio.frozen = False
        if restarted:
            h.transport._confirmed.clear()  # a new process knows no ACKs

        again = await h.transport.send(
            Reply(
                inbound=inbound,
                text=text,
                outbox_id=7,
                done_parts=frozenset(recorded),
                packet_ids=tuple(planned.items()),
                plan=plan,
                progress=progress,
            )
        )
        # restarted: part 1's repeat is ACKed again by the recipient (firmware 2.6+), part 2
        # by its first send; else part 1 was confirmed earlier and not written again
        assert again.status is (DeliveryStatus.DELIVERED if restarted else DeliveryStatus.SENT)
        # every part shown exactly once, each with its planned id
        assert sorted(p.id for _, p in h.radio.shown) == sorted(planned.values())
        assert {p.id for _, p in h.radio.sent_texts()} == set(planned.values())
        if restarted:  # part 1 written again (its ACK was not known): dropped, not shown
            assert [p.id for _, p in h.radio.repeats] == [planned[0]]
        else:  # ACKed in this run: not written again
            assert h.radio.repeats == [] and len(h.radio.sent_texts()) == 3
