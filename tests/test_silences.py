"""The smaller silences of issue 28 point 5, each now answered: a DM of nothing but invalid
UTF-8 (dropped with no reply before; a NUL-only one got "Your message was empty")."""

from __future__ import annotations

from pathlib import Path

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
