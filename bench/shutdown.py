"""How long a stop takes, worst case included (issue 18: systemd's TimeoutStopSec=45). Not a test.

Run: ``python -m bench.shutdown``. Each scenario starts the real app (responder, SQLite store,
the real openai client over HTTP to the fake LLM on 127.0.0.1) with an in-process transport,
puts it in a state, then times ``App.close`` on the wall clock with the shipped budget
(``STOP_SECONDS``):

- idle: nothing in flight;
- model hangs: one person's model call never answers (the drain waits for it until its share);
- everything hangs: that, plus a reply whose send never returns, plus a transport whose stop
  never returns and swallows its cancel (a buggy library): the deadline has to cut all of it.

Printed per scenario: the stop time, the steps the deadline cut off, and whether the store
still holds the cut reply as pending (nothing lost, nothing marked sent; "claimed": by the
stopped process, released when the same gateway starts again).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from bot.app import STOP_SECONDS, build
from bot.domain import Delivery, Reply
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport


class Stuck(FakeTransport):
    """``hang_send``: the link never takes a reply; ``hang_stop``: stop never returns and
    swallows its first cancel."""

    def __init__(self, *, hang_send: bool, hang_stop: bool) -> None:
        super().__init__(name="mesh")
        self.hang_send, self.hang_stop = hang_send, hang_stop
        self.sending = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, reply: Reply) -> Delivery:
        if not self.hang_send:
            return await super().send(reply)
        self.sending.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        if not self.hang_stop:
            return await super().stop()
        with contextlib.suppress(asyncio.CancelledError):  # a library that ignores the cancel
            await asyncio.Event().wait()
        await self.release.wait()


async def _wait(check: object) -> None:
    for _ in range(6000):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the scenario did not reach its state")


async def scenario(name: str, *, llm_hangs: bool, send_hangs: bool, stop_hangs: bool) -> str:
    llm = FakeLLM()
    await llm.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            side = Stuck(hang_send=send_hangs, hang_stop=stop_hangs)
            app = await build(make_config(Path(tmp), llm.base_url), env={}, transports=[side])
            await app.start()
            if send_hangs:
                await side.say("a question whose answer never leaves", sender="!0000b0b0")
                await _wait(side.sending.is_set)
            if llm_hangs:
                llm.script = [("sleep", 3600.0)]
                await side.say("a question the model never answers", sender="!0000a11c")
                await _wait(lambda: any(e[0] == "start" for e in llm.events[-1:]))
            began = time.monotonic()
            await app.close()
            took = time.monotonic() - began
            side.release.set()
            with sqlite3.connect(app.config.database_path) as db:  # read from outside
                rows = db.execute(
                    "SELECT state, claimed_by IS NOT NULL FROM outbox WHERE state != 'delivered'"
                ).fetchall()
            kept = ", ".join(f"{s}{' (claimed)' if c else ''}" for s, c in rows) or "none"
            cut = ", ".join(app.cut_at_stop) or "-"
            return f"| {name} | {took:.1f} | {cut} | {kept} |"
    finally:
        await llm.stop()


async def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    print(f"stop budget STOP_SECONDS = {STOP_SECONDS:.0f} s (systemd TimeoutStopSec=45)")
    print("| scenario | stop took (s, wall) | cut off by the deadline | outbox rows kept |")
    print("|---|---|---|---|")
    print(await scenario("idle", llm_hangs=False, send_hangs=False, stop_hangs=False))
    print(await scenario("model hangs", llm_hangs=True, send_hangs=False, stop_hangs=False))
    print(await scenario("everything hangs", llm_hangs=True, send_hangs=True, stop_hangs=True))
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
