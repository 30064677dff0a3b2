"""Key pins on one PostgreSQL store shared by two gateways, each with its own radio (the fake
radio through the unmodified meshtastic interface): a pin made through one gateway holds in
the other, so a packet forged to the second radio is refused there too (issue 44, point 7)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app import App, build
from bot.transports.mesh_keys import REFUSED
from tests import pg_server
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import node_key
from tests.fakes.mesh_harness import Harness, mesh_harness

pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")

VICTIM = 0x20000001
VICTIM_ID = f"!{VICTIM:08x}"
OTHER_KEY = hashlib.sha256(b"another radio").digest()


@contextlib.asynccontextmanager
async def gateway(tmp: Path, llm: FakeLLM, url: str) -> AsyncIterator[tuple[App, Harness]]:
    tmp.mkdir()
    extra = f"storage:\n  url: '{url}'\n  password_env: PW\n"
    async with mesh_harness(start=False) as h:
        config = make_config(tmp, llm.base_url, extra)
        app = await build(config, env={"PW": pg_server.BOT_PASSWORD}, transports=[h.transport])
        try:
            await app.start()
            await h.connected()
            yield app, h
        finally:
            await app.close()


def _texts_to(h: Harness, num: int) -> list[str]:
    return [bytes(p.decoded.payload).decode() for _, p in h.radio.sent_texts() if p.to == num]


async def test_a_pin_made_through_one_gateway_holds_in_the_other(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    fake_llm.reply = "Noted."
    async with (
        gateway(tmp_path / "a", fake_llm, url) as (app_a, a),
        gateway(tmp_path / "b", fake_llm, url) as (app_b, b),
    ):
        a.radio.inject_text("!remember my door code is 4521", frm=VICTIM)  # PKI: pins the key
        await a.until(lambda: len(_texts_to(a, VICTIM)) == 1, "gateway A's reply")
        await app_a.responder.wait_idle()
        [pin] = await app_b.store.key_pins()
        assert (pin.person, pin.public_key) == (VICTIM_ID, node_key(VICTIM))
        facts = await app_b.store._all("SELECT text FROM facts")
        for forged in ({"pki_encrypted": False}, {"pki_encrypted": True, "public_key": OTHER_KEY}):
            b.radio.inject_text("!forget", frm=VICTIM, **forged)
        assert app_b.pins is not None
        pins_b = app_b.pins
        await b.until(lambda: sum(pins_b.counts().values()) == 2, "both refused on gateway B")
        await b.until(lambda: _texts_to(b, VICTIM) == [REFUSED], "one notice from gateway B")
        await app_b.responder.wait_idle()
        assert await app_b.store._all("SELECT text FROM facts") == facts
        assert pins_b.counts() == {"refused_key_changed": 1, "refused_no_pki": 1}
        # the victim's own radio, heard by gateway B, is the victim there too
        fake_llm.reply = "Your door code is 4521."
        b.radio.inject_text("what is my door code?", frm=VICTIM)
        await b.until(lambda: len(_texts_to(b, VICTIM)) == 2, "gateway B's answer")
        await app_b.responder.wait_idle()
        assert "4521" in str(fake_llm.chat_requests()[-1]["messages"])
        # a re-pin through gateway B is seen by gateway A
        assert app_a.pins is not None
        await app_b.pins.repin(VICTIM_ID, OTHER_KEY)
        assert await app_a.pins.pinned(VICTIM_ID) == OTHER_KEY


async def test_two_gateways_pinning_at_once_agree_on_one_key(
    tmp_path: Path, fake_llm: FakeLLM, url: str
) -> None:
    async with (
        gateway(tmp_path / "a", fake_llm, url) as (app_a, _a),
        gateway(tmp_path / "b", fake_llm, url) as (app_b, _b),
    ):
        assert app_a.pins is not None and app_b.pins is not None
        import asyncio

        first, second = await asyncio.gather(
            app_a.pins.pin_first(VICTIM_ID, node_key(VICTIM)),
            app_b.pins.pin_first(VICTIM_ID, OTHER_KEY),
        )
        assert first == second  # whichever won, both gateways hold the same key
        assert len(await app_a.store.key_pins()) == 1
