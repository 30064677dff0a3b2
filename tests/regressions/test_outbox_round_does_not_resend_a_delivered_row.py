"""Regression (bench/pipeline: "1 calls, 2 replies"): the periodic outbox round read the
undelivered rows, awaited, then checked what was in flight; a row whose delivery finished
during that await looked undelivered and was sent a second time from its stale snapshot.

Both tests make the race happen deterministically: the store's ``undelivered()`` reads its
rows, then (before returning them to the round) lets a delivery of one of those rows run to
its end. Real SQLite, real openai client against the fake LLM server, the in-process fake
transport; on the code before outbox claims each test saw the answer sent twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bot.domain import Delivery, Reply
from bot.memory.records import OutboxRow
from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport


class GatedTransport(FakeTransport):
    """A fake transport whose ``send`` waits at a gate (a slow radio, a Discord round trip)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def send(self, reply: Reply) -> Delivery:
        self.entered.set()
        await self.gate.wait()
        return await super().send(reply)


async def _states(h: Harness) -> list[str]:
    return [r[0] for r in await h.store._all("SELECT state FROM outbox ORDER BY id")]


async def test_a_round_reading_while_a_turn_delivers_does_not_send_that_answer_again(
    tmp_path: object, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = GatedTransport()
    h = await start_harness(tmp_path, fake_llm, transport=transport)  # type: ignore[arg-type]
    try:
        fake_llm.reply = "Only once."
        transport.gate.clear()
        await transport.say("question")  # the turn runs; its delivery waits at the gate
        await asyncio.wait_for(transport.entered.wait(), 10)
        read = h.store.undelivered

        async def undelivered_while_the_turn_finishes(
            *, transports: Sequence[str]
        ) -> list[OutboxRow]:
            rows = await read(transports=transports)
            transport.gate.set()  # the turn's delivery finishes during the round's await
            for _ in range(500):
                if await _states(h) == ["delivered"]:
                    break
                await asyncio.sleep(0.01)
            return rows

        monkeypatch.setattr(h.store, "undelivered", undelivered_while_the_turn_finishes)
        await h.app.responder.redeliver()
        await h.app.responder.wait_idle()
        assert transport.texts() == ["Only once."]
        assert await _states(h) == ["delivered"]
    finally:
        await h.app.close()


async def test_two_rounds_racing_for_a_waiting_row_send_it_once(
    tmp_path: object, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = GatedTransport()
    h = await start_harness(tmp_path, fake_llm, transport=transport)  # type: ignore[arg-type]
    try:
        fake_llm.reply = "Waited, then once."
        transport.link_down = True
        await h.say("question")  # no link: the answer waits in the outbox (unclaimed)
        assert await _states(h) == ["pending"]
        transport.link_down = False
        read = h.store.undelivered
        inner = asyncio.Event()

        async def undelivered_while_another_round_delivers(
            *, transports: Sequence[str]
        ) -> list[OutboxRow]:
            rows = await read(transports=transports)
            if not inner.is_set():  # the first round: a second one delivers the row meanwhile
                inner.set()
                assert await h.app.responder.redeliver() == 1
                await h.app.responder.wait_idle()
                assert await _states(h) == ["delivered"]
            return rows

        monkeypatch.setattr(h.store, "undelivered", undelivered_while_another_round_delivers)
        await h.app.responder.redeliver()
        await h.app.responder.wait_idle()
        assert transport.texts() == ["Waited, then once."]
        assert await _states(h) == ["delivered"]
    finally:
        await h.app.close()


async def test_a_claim_left_by_a_dead_process_is_released_at_the_next_start(
    tmp_path: object, fake_llm: FakeLLM
) -> None:
    from pathlib import Path

    path = Path(str(tmp_path))
    h = await start_harness(path, fake_llm)
    fake_llm.reply = "Kept."
    h.transport.link_down = True
    await h.say("question")
    # as if the process died while sending: the row is claimed by a token nobody holds now
    await h.store._db.execute("UPDATE outbox SET claimed_by = 'local/1/dead', claimed_at = 1")
    assert await h.app.responder.redeliver() == 0  # a live claim is never taken over
    await h.app.close()
    h2 = await start_harness(path, fake_llm)  # the restart releases it and sends the answer
    try:
        await h2.app.responder.wait_idle()
        assert h2.transport.texts() == ["Kept."]
        assert await _states(h2) == ["delivered"]
    finally:
        await h2.app.close()
