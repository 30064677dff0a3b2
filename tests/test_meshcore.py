"""The MeshCore transport against the fake companion, through the unmodified meshcore library."""

from __future__ import annotations

from bot.domain import DM_SPACE, DeliveryStatus, Reply
from tests.fakes.meshcore_harness import meshcore_run


async def test_a_dm_is_answered_by_dm_and_acked() -> None:
    async with meshcore_run() as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "hello bot")
        await run.until(lambda: len(run.inbox) == 1)
        inbound = run.inbox[0]
        assert inbound.sender == alice.key.hex()
        assert inbound.authenticated and inbound.space == DM_SPACE
        assert inbound.sender_name == "Alice" and inbound.text == "hello bot"
        delivery = await run.transport.send(Reply(inbound=inbound, text="Hi Alice!"))
        assert delivery.status is DeliveryStatus.DELIVERED
        assert alice.shown == ["Hi Alice!"]
