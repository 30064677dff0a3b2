"""MeshCore load benchmark: many people DM the bot at once through a companion. Not a test.

Run: ``python -m bench.meshcore_load [--people 15] [--write-docs] [-v]``.

What runs: the real app (responder, SQLite store, context, the real openai client over HTTP to
the fake LLM on 127.0.0.1) with the real MeshCore transport and the unmodified ``meshcore``
library over TCP against the fake companion (``tests/fakes/fake_meshcore.py``), on the virtual
clock of the tests (virtual time stands still while the app does real work: store, LLM;
``hold_clock_while_busy``): the companion stamps every packet with that clock, so airtime and
latency are exact. ``people`` contacts send one DM each at the same moment; ACKs instant or
20 s late (multi-hop); the channel quiet, or busy: other nodes fill ``others`` percent of the
airtime, which the companion's radio counters (``GET_STATS``) report and the bot's pacer reads
every 60 virtual seconds (its probe; two readings are taken before the burst). Radio: SF11,
BW 250 kHz, CR 4/5 (Meshtastic LongFast's modulation, so the figures sit beside
``bench.mesh_load``'s), spacing 3 s, busy_threshold 20%, the same one-packet answer.

Reported per scenario (virtual seconds): the bot's airtime share (its packets' time on air
over the time from the questions to the last packet); first-part latency (first, median and
last person) against the ideal (packets x spacing); packets per answer; undelivered answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.app import App, build
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.mesh_harness import hold_clock_while_busy
from tests.fakes.meshcore_harness import Run, meshcore_run

ROOT = Path(__file__).resolve().parents[1]
SPACING = 3.0
ANSWER = "Rain later today, about 5 mm; take a jacket if you go out this afternoon."


@dataclass
class Result:
    people: int
    acks: str
    others: float
    share: float
    first: float
    median: float
    last: float
    ideal: float
    packets_per_answer: float
    undelivered: int


@contextlib.asynccontextmanager
async def _app(tmp: Path, llm: FakeLLM, run: Run) -> AsyncIterator[App]:
    extra = "bot:\n  rate_limit: {messages: 1000, per_seconds: 60}\n"
    config = make_config(tmp, llm.base_url, extra)
    app = await build(config, env={}, transports=[run.transport], clock=run.clock.monotonic)
    try:
        await app.start()
        await run.until(lambda: run.transport.health().link == "up")
        yield app
    finally:
        await app.close()


async def scenario(people: int, *, delayed: bool, others: float, llm: FakeLLM) -> Result:
    radio = {"ack_delay": 20.0 if delayed else 0.5, "sf": 11, "bw_khz": 250.0, "cr": 5}
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            meshcore_run(
                start=False,
                radio_kwargs=radio,
                spacing_seconds=SPACING,
                probe_every=60.0,
                probe_timeout=5.0,
                call_timeout=5.0,
            ) as run,
            _app(Path(tmp), llm, run) as app,
        ):
            run.radio.others_share = others
            hold: Any = run  # has .clock and .transport._inbound, as the helper needs
            hold_clock_while_busy(hold, app)
            await run.virtual(121.0)  # two stats samples: the pacer knows the channel
            if "-v" in sys.argv:
                print(run.transport.outbox.pacer.fresh(run.clock.monotonic()))
            crowd = [run.radio.person(f"P{i:02d}") for i in range(people)]
            await run.transport._companion.refresh_contacts()  # type: ignore[union-attr]
            t0 = run.clock.monotonic()
            for person in crowd:
                run.radio.dm_from(person, "what is the weather tomorrow?")
            for _ in range(20_000):  # hang guard: until every question is settled
                pending = await app.store._all(
                    "SELECT count(*) FROM messages WHERE role = 'user' AND status = 'pending'"
                )
                waiting = await app.store._all(
                    "SELECT count(*) FROM outbox WHERE state = 'pending'"
                )
                stored = await app.store._all("SELECT count(*) FROM messages WHERE role='user'")
                if stored[0][0] == people and pending[0][0] == 0 and waiting[0][0] == 0:
                    break
                await asyncio.sleep(0.02)
            await app.responder.wait_idle()
            states = await app.store._all("SELECT state FROM outbox WHERE kind = 'answer'")
            sent = [a for a in run.radio.on_air if a.kind == "dm" and a.at >= t0]
            span = max((a.at for a in sent), default=t0 + 1.0) - t0 or 1.0
            airtime = sum(run.radio.airtime(len(a.text), dm=True) for a in sent)
            if "-v" in sys.argv:
                print([round(a.at - t0, 1) for a in sent])
    first_at: dict[str, float] = {}
    for a in sent:
        first_at.setdefault(a.to, a.at - t0)
    latencies = sorted(first_at.values())
    undelivered = sum(1 for (state,) in states if state not in ("delivered", "sent"))
    return Result(
        people=people,
        acks="delayed 20 s" if delayed else "instant",
        others=others,
        share=100.0 * airtime / span,
        first=latencies[0] if latencies else math.nan,
        median=statistics.median(latencies) if latencies else math.nan,
        last=latencies[-1] if latencies else math.nan,
        ideal=len({(a.to, a.text) for a in sent}) * SPACING,
        packets_per_answer=len(sent) / max(1, len(states)),
        undelivered=undelivered + (people - len(states)),
    )


def table(results: list[Result]) -> str:
    lines = [
        "| people | ACKs | channel (others' airtime) | bot airtime share | first-part latency "
        "first / median / last (s) | ideal (s) | packets/answer | undelivered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        channel = f"busy ({r.others:g}%)" if r.others else "quiet"
        lines.append(
            f"| {r.people} | {r.acks} | {channel} | {r.share:.1f}% | {r.first:.0f} / "
            f"{r.median:.0f} / {r.last:.0f} | {r.ideal:.0f} | {r.packets_per_answer:.2f} | "
            f"{r.undelivered} |"
        )
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, nargs="+", default=[15])
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("-v", action="store_true", help="print each scenario's packet times")
    args = parser.parse_args(argv)
    llm = FakeLLM()
    llm.reply = ANSWER
    await llm.start()
    results = []
    try:
        for people in args.people:
            for delayed in (False, True):
                for others in (0.0, 15.0):
                    r = await scenario(people, delayed=delayed, others=others, llm=llm)
                    results.append(r)
                    print(table([r]).splitlines()[-1], flush=True)
    finally:
        await llm.stop()
    text = table(results)
    print(text)
    if args.write_docs:
        path = ROOT / "docs" / "benchmarks.md"
        doc = path.read_text(encoding="utf-8")
        block = f"<!-- meshcore_load:begin -->\n{text}\n<!-- meshcore_load:end -->"
        pattern = re.compile(r"<!-- meshcore_load:begin -->.*?<!-- meshcore_load:end -->", re.S)
        if not pattern.search(doc):
            print("docs/benchmarks.md has no meshcore_load block", file=sys.stderr)
            return 1
        path.write_text(pattern.sub(block, doc), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
