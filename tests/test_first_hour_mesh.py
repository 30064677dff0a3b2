"""The first hour on the mesh (issue 38), in the real app on the fake radio: the "LLM
unavailable" notice goes out as one packet naming where the bot looked, and ``!more`` under an
answer the model broke off at max_tokens asks the model to go on (not only radio parts)."""

from __future__ import annotations

from pathlib import Path

from bot.commands import GO_ON
from bot.llm.port import TRUNCATED_MARK
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE
from tests.fakes.mesh_harness import mesh_harness
from tests.test_meshtastic_app import running_app


def _on_air(h: object) -> list[str]:
    return [p.decoded.payload.decode("utf-8") for _, p in h.radio.sent_texts()]  # type: ignore[attr-defined]


async def test_the_unavailable_notice_is_one_packet_with_the_url(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    url = fake_llm.base_url
    await fake_llm.stop()
    async with mesh_harness(start=False) as h, running_app(tmp_path, fake_llm, h) as app:
        h.radio.inject_text("hello?", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) >= 1, "the notice on air")
        await app.responder.wait_idle()
        [notice] = _on_air(h)
        assert url in notice and "llm.base_url" in notice
        assert len(notice.encode("utf-8")) <= 200


async def test_more_on_the_mesh_goes_on_after_a_max_tokens_cut(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.script = [("length", "Antennas come in three kinds: the dipole, the")]
    async with mesh_harness(start=False) as h, running_app(tmp_path, fake_llm, h) as app:
        h.radio.inject_text("tell me about antennas", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the cut answer")
        await app.responder.wait_idle()
        assert _on_air(h)[0].endswith(TRUNCATED_MARK)  # one packet: no radio parts to give
        fake_llm.script = [("reply", "yagi and the ground plane.")]
        h.radio.inject_text("!more", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 2, "the continuation")
        await app.responder.wait_idle()
        assert _on_air(h)[1] == "yagi and the ground plane."
        assert fake_llm.chat_requests()[-1]["messages"][-1]["content"].endswith(GO_ON)
