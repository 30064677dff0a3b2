"""The Meshtastic transport against the unmodified library and the fake radio."""

from __future__ import annotations

import asyncio

from bot.domain import DM_SPACE, DeliveryStatus, Reply
from tests.fakes.fake_radio import ALICE, BOB, BROADCAST, MY_NUM, STRANGER
from tests.fakes.mesh_harness import mesh_harness


async def test_dm_in_answer_out() -> None:
    async with mesh_harness() as h:
        pid = h.radio.inject_text("what's the weather?", frm=ALICE)
        inbound = await h.message()
        assert inbound.transport == "meshtastic"
        assert inbound.sender == "!a11ce001"
        assert inbound.space == DM_SPACE
        assert inbound.text == "what's the weather?"
        assert inbound.sender_name == "Alice"
        assert inbound.message_id == str(pid)
        delivery = await h.reply(inbound, "Sunny, 21 C.")
        assert delivery.status is DeliveryStatus.DELIVERED
        ((_, packet),) = h.radio.sent_texts()
        assert packet.decoded.payload == b"Sunny, 21 C."
        assert (packet.to, packet.channel, packet.want_ack) == (ALICE, 0, True)
        assert packet.decoded.reply_id == pid
        assert delivery.message_ids == (str(packet.id),)
