"""Runs the real MeshCore transport, through the unmodified ``meshcore`` library over TCP, against
the fake companion (``fake_meshcore``) on a virtual clock.

On exit it stops everything and checks the on-air rules whatever the test checked: every DM
is at most 160 bytes, every channel text (name prefix included) arrived whole (the firmware's
silent cut at 160 bytes never bit), and consecutive packets are at least ``spacing_seconds``
apart on the virtual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from bot.config import MeshCoreConfig
from bot.domain import Inbound
from bot.transports.meshcore import MeshCoreTransport, build_meshcore
from tests.fakes.fake_clock import FakeClock
from tests.fakes.fake_meshcore import MAX_TEXT_LEN, FakeCompanion

FAST: dict[str, Any] = {
    "reconnect_initial": 5.0,
    "reconnect_max": 60.0,
    "connect_timeout": 5.0,
    "call_timeout": 1.0,
    "probe_every": 0.0,
    "probe_timeout": 1.0,
    "cooldown": 0.0,
    "channel_cooldown": 0.0,
    "channels": (0,),
}
EPOCH = 1_780_000_000.0


@dataclass
class Run:
    clock: FakeClock
    radio: FakeCompanion
    transport: MeshCoreTransport
    config: MeshCoreConfig
    inbox: list[Inbound] = field(default_factory=list)

    async def until(self, what: Callable[[], bool], *, seconds: float = 10.0) -> None:
        """Wait (real time, bounded) until ``what()``: the library works over real sockets."""
        end = time.monotonic() + seconds
        while not what():
            if time.monotonic() > end:
                raise AssertionError("condition not met in time")
            await asyncio.sleep(0.01)

    async def virtual(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass (the clock moves when the world is quiet)."""
        await self.clock.sleep(seconds)


def check_on_air(radio: FakeCompanion, *, spacing: float) -> None:
    last: float | None = None
    for packet in radio.on_air:
        assert len(packet.text) <= MAX_TEXT_LEN, packet
        if packet.kind == "channel":
            assert packet.text.decode("utf-8"), packet  # a mid-character cut would not decode
            assert len(packet.text) < MAX_TEXT_LEN or not packet.text.endswith(b"\xe2"), packet
        if last is not None:
            assert packet.at - last >= spacing - 1e-6, (packet, last)
        last = packet.at


@contextlib.asynccontextmanager
async def meshcore_run(
    *, radio_kwargs: dict[str, Any] | None = None, start: bool = True, **overrides: Any
) -> AsyncIterator[Run]:
    clock = FakeClock()
    radio = FakeCompanion(clock=clock, **(radio_kwargs or {}))
    await radio.start()
    config = MeshCoreConfig.model_validate(
        {**FAST, "connection": "tcp", "host": "127.0.0.1", "port": radio.port, **overrides}
    )
    transport = build_meshcore(
        config,
        bot_name="meshsage",
        command_prefix="!",
        command_names=("help", "more", "forget"),
        clock=clock,
        rng=random.Random(7),
        wall=lambda: EPOCH + clock.monotonic(),
    )
    run = Run(clock=clock, radio=radio, transport=transport, config=config)

    async def on_message(inbound: Inbound) -> None:
        run.inbox.append(inbound)

    try:
        if start:
            await transport.start(on_message)
            await run.until(lambda: transport.health().link == "up")
        yield run
    finally:
        await transport.stop()
        await radio.close()
        await clock.close()
    check_on_air(radio, spacing=config.spacing_seconds)
