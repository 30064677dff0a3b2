"""Mesh load benchmark: many people DM the bot at once (issue 10). Not a test.

Run: ``python -m bench.mesh_load [--people 15 30] [--write-docs]`` or the soak:
``python -m bench.mesh_load --minutes 30`` (50 people, RSS over time).

What runs: the real app (responder, SQLite store, context, the real openai client over HTTP to
the fake LLM on 127.0.0.1) with the real Meshtastic transport and the unmodified library
``TCPInterface`` against the fake radio, on the virtual clock of the tests (``FakeClock``): the
radio stamps every packet with that clock, so airtime and latency are exact and a 45 s ACK
timeout costs milliseconds. Scenarios: ``people`` nodes send one DM each at the same moment;
ACKs instant or delayed (20 s, as on a multi-hop mesh); optionally one node that never ACKs.

Each scenario runs with the airtime limit (the radio reports device metrics, so the bot keeps
its channel share under ``busy_threshold``, 20% by default) and, for comparison, without it (a
radio without device metrics: spacing alone, the behaviour before issue 18).

Reported per scenario (virtual seconds):
- airtime share: the bot's own transmissions (LoRa LongFast time-on-air of each text packet,
  plus the firmware's 3 retransmissions for every part that got no ACK) divided by the time
  from the first question to the last packet;
- channel utilisation: what the radio reports (its last minute of traffic; only the bot talks
  here), peak and mean over the bot's packets;
- first-part latency: from the questions to the first packet to each person; first, median and
  last person; ``ideal`` is the time the paced radio needs for every reply (packets x spacing);
- packets per answer, busy notices (outbox full), undelivered answers (live nodes only).
Soak: 50 people keep writing for ``--minutes`` wall minutes; RSS is sampled every 1,000 messages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.app import App, build
from bot.transports.mesh_airtime import lora_airtime
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import Later
from tests.fakes.mesh_harness import Harness, mesh_harness

ROOT = Path(__file__).resolve().parents[1]
SPACING = 3.0
FIRMWARE_RETRIES = 3
SAMPLE_EVERY = 1000  # soak: messages between RSS samples
ANSWER = "Rain later today, about 5 mm; take a jacket if you go out this afternoon."


@dataclass
class Result:
    people: int
    acks: str
    dead: bool
    limit: bool
    share: float
    channel_peak: float
    channel_mean: float
    first: float
    median: float
    last: float
    ideal: float
    packets_per_answer: float
    busy: int
    undelivered: int


@contextlib.asynccontextmanager
async def _app(tmp: Path, llm: FakeLLM, h: Harness) -> AsyncIterator[App]:
    extra = "bot:\n  rate_limit: {messages: 1000, per_seconds: 60}\n"
    app = await build(make_config(tmp, llm.base_url, extra), env={}, transports=[h.transport])
    try:
        await app.start()
        await h.connected()
        yield app
    finally:
        await app.close()


async def scenario(
    people: int, *, delayed: bool, dead: bool, llm: FakeLLM, limit: bool = True
) -> Result:
    nodes = [0xB0000001 + i for i in range(people)]
    dead_node = nodes[people // 2] if dead else None

    def routing(packet: Any, attempt: int) -> Any:
        if packet.to == dead_node:
            return None
        return Later("NONE", delay=20.0) if delayed else "NONE"

    with tempfile.TemporaryDirectory() as tmp:
        async with (
            mesh_harness(start=False, spacing_seconds=SPACING, cooldown=0.0, metrics=limit) as h,
            _app(Path(tmp), llm, h) as app,
        ):
            h.radio.routing = routing
            _hold_clock_during_store_writes(app, h)
            t0 = h.clock.monotonic()
            for num in nodes:
                h.radio.inject_text("what is the weather tomorrow?", frm=num)
            for _ in range(6000):  # hang guard: until every question is settled
                rows = await app.store._all(
                    "SELECT count(*) FROM messages WHERE role = 'user' AND status = 'pending'"
                )
                open_rows = await app.store._all(
                    "SELECT count(*) FROM outbox WHERE state = 'pending'"
                )
                stored = await app.store._all("SELECT count(*) FROM messages WHERE role='user'")
                if stored[0][0] == people and rows[0][0] == 0 and open_rows[0][0] == 0:
                    break
                await asyncio.sleep(0.02)
            await app.responder.wait_idle()
            states = await app.store._all("SELECT person, state FROM outbox WHERE kind = 'answer'")
            limited = await app.store._all(
                "SELECT count(*) FROM messages WHERE role = 'user' AND status = 'limited'"
            )
            sent = h.radio.sent_texts()
    first_at: dict[int, float] = {}
    airtime = 0.0
    unacked = {p.id for _, p in sent if p.to == dead_node}
    for t, packet in sent:
        first_at.setdefault(packet.to, t - t0)
        one = lora_airtime(len(packet.decoded.payload))
        airtime += one * (1 + (FIRMWARE_RETRIES if packet.id in unacked else 0))
    span = max(t for t, _ in sent) - t0 if sent else 1.0
    own = [(t, lora_airtime(len(p.decoded.payload))) for t, p in sent]
    channel = [100.0 * sum(a for u, a in own if t - 60.0 < u <= t) / 60.0 for t, _ in own]
    latencies = sorted(v for k, v in first_at.items() if k != dead_node)
    answers = [s for s in states if s[0] != f"!{dead_node or 0:08x}"]
    undelivered = sum(1 for _, state in answers if state not in ("delivered", "sent"))
    return Result(
        people=people,
        acks="delayed 20 s" if delayed else "instant",
        dead=dead,
        limit=limit,
        share=airtime / span,
        channel_peak=max(channel, default=0.0),
        channel_mean=statistics.mean(channel) if channel else 0.0,
        first=latencies[0] if latencies else math.nan,
        median=statistics.median(latencies) if latencies else math.nan,
        last=latencies[-1] if latencies else math.nan,
        ideal=len({(p.to, bytes(p.decoded.payload)) for _, p in sent}) * SPACING,
        packets_per_answer=len(sent) / max(1, len(states)),
        busy=int(limited[0][0]),
        undelivered=undelivered + (people - len(states) - int(limited[0][0])),
    )


def _hold_clock_during_store_writes(app: App, h: Harness) -> None:
    """Virtual time must not jump while the outbox records a part (a write of milliseconds on
    a real machine): the fake clock otherwise advances to the next sleeper (a 20 s delayed
    ACK) whenever the loop waits for SQLite's thread, which inflates latencies."""
    store: Any = app.store
    inflight = [0]
    for name in ("plan_part", "record_part", "claim_delivery", "finish_delivery"):
        original = getattr(store, name)

        async def counted(*args: Any, _original: Any = original, **kw: Any) -> Any:
            inflight[0] += 1
            try:
                return await _original(*args, **kw)
            finally:
                inflight[0] -= 1

        setattr(store, name, counted)
    h.clock.settle_hooks.append(lambda: inflight[0] > 0)


def table(results: list[Result]) -> str:
    head = (
        "| people | ACKs | dead node | airtime limit | bot airtime share | channel util. peak /"
        " mean | first-part latency first / median / last (s) | ideal (s) | packets/answer |"
        " busy notices | undelivered |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r.people} | {r.acks} | {'yes' if r.dead else 'no'} | "
        f"{'20%' if r.limit else 'off (spacing only)'} | {r.share:.1%} | "
        f"{r.channel_peak:.0f}% / {r.channel_mean:.0f}% | "
        f"{r.first:.0f} / {r.median:.0f} / {r.last:.0f} | {r.ideal:.0f} | "
        f"{r.packets_per_answer:.2f} | {r.busy} | {r.undelivered} |"
        for r in results
    ]
    return head + "\n".join(rows) + "\n"


def rss_kb() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def soak(minutes: float, llm: FakeLLM) -> list[tuple[int, float, int]]:
    """(messages, wall seconds, RSS KiB) every 1,000 messages for ``minutes``."""
    nodes = [0xD0000001 + i for i in range(50)]
    samples: list[tuple[int, float, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            mesh_harness(start=False, spacing_seconds=SPACING, cooldown=0.0) as h,
            _app(Path(tmp), llm, h) as app,
        ):
            start = time.monotonic()
            sent = 0
            while time.monotonic() - start < minutes * 60:
                for num in nodes:
                    h.radio.inject_text(f"message {sent} about the weather", frm=num)
                    sent += 1
                for _ in range(3000):  # hang guard: until the bot has stored the round
                    row = await app.store._all("SELECT count(*) FROM messages WHERE role='user'")
                    if row[0][0] >= sent:
                        break
                    await asyncio.sleep(0.01)
                await app.responder.wait_idle()
                await h.until(lambda: not h.transport._jobs, "outbox empty")
                llm.requests.clear()  # the fake's own logs, not the bot's memory
                llm.events.clear()
                h.radio.log.clear()
                h.radio.on_air.clear()
                if sent % SAMPLE_EVERY < len(nodes):
                    samples.append((sent, time.monotonic() - start, rss_kb()))
                    print(f"{sent} messages, {samples[-1][1]:.0f} s, RSS {samples[-1][2]} KiB",
                          file=sys.stderr)  # fmt: skip
    return samples


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--people", type=int, nargs="+", default=[15, 30])
    parser.add_argument("--minutes", type=float, default=0.0, help="soak mode: wall minutes")
    parser.add_argument(
        "--write-docs", action="store_true", help="update docs/benchmarks.md's table"
    )
    args = parser.parse_args(argv)
    llm = FakeLLM()
    llm.reply = ANSWER
    await llm.start()
    try:
        if args.minutes:
            samples = await soak(args.minutes, llm)
            for n, t, rss in samples:
                print(f"| {n} | {t:.0f} | {rss / 1024:.1f} |")
            return
        results = []
        for people in args.people:
            for delayed in (False, True):
                for dead, limit in ((False, False), (False, True), (True, True)):
                    results.append(
                        await scenario(people, delayed=delayed, dead=dead, llm=llm, limit=limit)
                    )
                    print(table(results[-1:]).splitlines()[-1], file=sys.stderr)
        text = table(results)
        print(text)
        if args.write_docs:
            _write_docs(text)
    finally:
        await llm.stop()


def _write_docs(text: str, doc: Path | None = None) -> None:
    """Replace the table between the mesh_load markers of ``doc`` (docs/benchmarks.md)."""
    doc = doc or ROOT / "docs" / "benchmarks.md"
    begin, end = "<!-- mesh_load:begin -->", "<!-- mesh_load:end -->"
    body = doc.read_text(encoding="utf-8")
    if begin not in body:
        raise SystemExit(f"{doc} has no {begin} marker")
    head, rest = body.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(head + begin + "\n" + text + end + tail, encoding="utf-8")


if __name__ == "__main__":
    asyncio.run(main())
