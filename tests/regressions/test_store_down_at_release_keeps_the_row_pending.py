"""Regression (issue 18 report, "noticed"): a reply that waits for its link gives its outbox
claim back (``release_delivery``); when the store was briefly unusable at that moment, the
error reached the worker's loop boundary: a round's delivery marked the row ``failed``, a
turn's own delivery left it claimed for good (no round lists a claimed row) and told the
person "internal error"; either way the answer was never sent. Now the row stays
``pending`` under the claim (nobody else sends it meanwhile), the next round gives the claim
back, and the answer goes out once.

Real SQLite (its "database is locked" error raised for the release), the real responder, the
real openai client against the fake LLM server, the in-process fake transport.
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport


@pytest.mark.parametrize("by", ["turn", "round"])
async def test_a_store_error_while_giving_a_claim_back_leaves_the_answer_deliverable(
    tmp_path: object, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    transport = FakeTransport()
    h = await start_harness(tmp_path, fake_llm, transport=transport)  # type: ignore[arg-type]
    try:
        release = h.store.release_delivery
        # the store is down for the release and for the next round's retry
        down = {"releases": 2 if by == "turn" else 0}

        async def release_while_the_store_is_down(outbox_id: int) -> None:
            if down["releases"] > 0:
                down["releases"] -= 1
                raise sqlite3.OperationalError("database is locked")
            await release(outbox_id)

        monkeypatch.setattr(h.store, "release_delivery", release_while_the_store_is_down)
        fake_llm.reply = "Sent once, later."
        transport.link_down = True
        await h.say("question")
        if by == "round":  # the turn gave its claim back; a round's try hits the outage
            down["releases"] = 2
            assert await h.app.responder.redeliver() == 1
            await h.app.responder.wait_idle()
        states = [r[0] for r in await h.store._all("SELECT state FROM outbox")]
        assert states == ["pending"]  # was: ["failed"] after a round
        assert transport.texts() == []

        transport.link_down = False
        assert await h.app.responder.redeliver() == 0  # the store is still down: claim kept
        await h.app.responder.wait_idle()
        assert transport.texts() == []
        assert await h.app.responder.redeliver() == 1  # the store is back: sent now
        await h.app.responder.wait_idle()
        assert transport.texts() == ["Sent once, later."]
        assert await h.app.responder.redeliver() == 0  # never twice
        await h.app.responder.wait_idle()
        assert transport.texts() == ["Sent once, later."]
        states = [r[0] for r in await h.store._all("SELECT state FROM outbox")]
        assert states == ["delivered"]
    finally:
        await h.app.close()
