"""The smaller silences of issue 28 point 5, each now answered: a DM of nothing but invalid
UTF-8 (dropped with no reply before; a NUL-only one got "Your message was empty"), and a
mesh part whose packet id could not be stored, sent again (shown twice before)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bot.domain import DeliveryStatus, Reply
from bot.responder import UNREADABLE
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE
from tests.fakes.mesh_harness import mesh_harness
from tests.test_meshtastic_app import running_app


async def test_a_dm_of_only_invalid_utf8_gets_a_reply(tmp_path: Path, fake_llm: FakeLLM) -> None:
    async with mesh_harness(start=False) as h, running_app(tmp_path, fake_llm, h):
        h.radio.inject_text(b"\xff\xfe\xc3", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the reply on air")
        [(_, packet)] = h.radio.sent_texts()
        assert packet.to == ALICE
        assert bytes(packet.decoded.payload).decode() == UNREADABLE
        assert fake_llm.chat_requests() == []  # the model never sees garbage


async def test_a_part_whose_id_could_not_be_stored_is_not_shown_twice() -> None:
    """The store failed (disk full) when the part's packet id was planned; the part went out.
    A later send of the same row plans the same id (derived from the row and the part), so
    the receiving radio drops the repeat. Before: a new random id, the part shown twice."""
    async with mesh_harness() as h:
        h.radio.inject_text("question")
        inbound = await h.message()

        async def full_disk(part: int, packet_id: int) -> int:
            raise sqlite3.OperationalError("database or disk is full")

        text = h.transport.fit("Shown once, even so.")
        first = await h.transport.send(
            Reply(inbound=inbound, text=text, outbox_id=41, plan=full_disk)
        )
        assert first.status is DeliveryStatus.DELIVERED
        # the row stayed pending without its part (the record failed too): sent again later
        await h.transport.send(Reply(inbound=inbound, text=text, outbox_id=41, plan=full_disk))
        ids = {p.id for _, p in h.radio.sent_texts()}
        assert len(ids) == 1 and len(h.radio.sent_texts()) >= 2  # (unACKed repeats retried)
        assert len(h.radio.shown) == 1 and len(h.radio.repeats) >= 1
