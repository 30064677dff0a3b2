"""A re-sent part carries its one packet id: what the receiving firmware does with the repeat,
and what the bot reports. The unmodified library against the fake radio, on the virtual clock.

Firmware 2.6+ (``NextHopRouter::shouldFilterReceived``) drops a repeat it already has and, when
the repeat is heard directly from its sender, sends its ACK again; through a relay, the relay's
rebroadcast is an implicit ACK; firmware before 2.6 sends nothing back for it."""

from __future__ import annotations

from bot.domain import DeliveryStatus
from tests.fakes.fake_radio import ACK_LOST, ALICE, Later
from tests.fakes.mesh_harness import mesh_harness


async def test_a_repeat_the_destination_already_shows_is_acknowledged_and_shown_once() -> None:
    """The destination shows the part but its ACK is lost; the re-send (same id) is dropped as a
    repeat and ACKed again. Before, the fake (and so the bot's tests) sent no ACK for it: the
    bot re-sent until ``ack_retries`` and reported the part failed."""
    async with mesh_harness() as h:
        h.radio.routing = lambda packet, attempt: ACK_LOST if attempt == 0 else "NONE"
        h.radio.inject_text("question", frm=ALICE)
        inbound = await h.message()
        delivery = await h.reply(inbound, "Kept once.")
        assert delivery.status is DeliveryStatus.DELIVERED
        assert [p.decoded.payload for _, p in h.radio.shown] == [b"Kept once."]
        first, again = (p for _, p in h.radio.sent_texts())
        assert first.id == again.id and [p.id for _, p in h.radio.repeats] == [first.id]


async def test_a_repeat_heard_through_a_relay_ends_sent_not_failed() -> None:
    async with mesh_harness() as h:
        h.radio.repeat_ack = "relay"
        h.radio.routing = lambda packet, attempt: ACK_LOST
        h.radio.inject_text("question", frm=ALICE)
        inbound = await h.message()
        delivery = await h.reply(inbound, "Kept once.")
        assert delivery.status is DeliveryStatus.SENT  # on the mesh; the recipient unconfirmed
        assert len(h.radio.shown) == 1


async def test_a_late_ack_for_an_earlier_send_delivers_the_part_without_a_resend() -> None:
    """The ACK comes after ``ack_timeout`` but before the re-send's backoff ends: it is the
    ACK of the part's one packet id. Before, a part past its timeout ignored it and was
    written again."""
    async with mesh_harness(ack_timeout=45.0, ack_backoff=30.0) as h:
        h.radio.routing = lambda packet, attempt: Later("NONE", delay=55.0)
        h.radio.inject_text("question", frm=ALICE)
        inbound = await h.message()
        delivery = await h.reply(inbound, "Late but there.")
        assert delivery.status is DeliveryStatus.DELIVERED
        assert len(h.radio.sent_texts()) == 1 and h.radio.repeats == []


async def test_on_firmware_before_2_6_an_unacked_repeat_says_it_may_have_arrived() -> None:
    """No ACK ever comes back (the first one lost, the repeats dropped silently): the bot cannot
    tell this from a node out of range, so the part ends failed, and the detail says it may
    have arrived (shown once, never twice)."""
    async with mesh_harness(ack_retries=1) as h:
        h.radio.repeat_ack = None
        h.radio.routing = lambda packet, attempt: ACK_LOST
        h.radio.inject_text("question", frm=ALICE)
        inbound = await h.message()
        delivery = await h.reply(inbound, "Kept once.")
        assert delivery.status is DeliveryStatus.FAILED
        assert "may have arrived" in (delivery.detail or "")
        assert len(h.radio.shown) == 1 and len(h.radio.repeats) == 1
