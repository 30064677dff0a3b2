"""Mesh load benchmark: many people DM the bot at once (issue 10). Not a test.

Run: ``python -m bench.mesh_load [--people 15 30] [--write-docs]`` or the soak:
``python -m bench.mesh_load --soak [--minutes 10] [--write-docs]`` (every question's fate).

What runs: the real app (responder, SQLite store, context, the real openai client over HTTP to
the fake LLM on 127.0.0.1) with the real Meshtastic transport and the unmodified library
``TCPInterface`` against the fake radio, on the virtual clock of the tests (``FakeClock``): the
radio stamps every packet with that clock, so airtime and latency are exact and a 45 s ACK
timeout costs milliseconds. Scenarios: ``people`` nodes send one DM each at the same moment;
ACKs instant or delayed (20 s, as on a multi-hop mesh); optionally one node that never ACKs.
Every person's node is in the radio's node DB (real radios announce their NodeInfo); senders
the radio never heard of are ``bench.forged_flood``'s subject.

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

Soak (``--soak``): four scenarios on the virtual clock, people asking for ``--minutes`` virtual
minutes (each person every ``every`` seconds, staggered), then until every question has settled
(at most two virtual hours more). The radio reports device metrics every 60 s like the firmware;
the app's outbox round runs every 10 virtual seconds; virtual time stands still while the app
does real work (store, LLM: ``hold_clock_while_busy``). Scenarios: metrics every 60 s (50
people, one question each every 2 min: the duty cycle is reached); metrics stop (same load; at
minute 2 the radio's last report says other nodes fill the channel, 35%, then it never reports
again: before, that figure held the bot forever); duty cycle spent for 10 minutes (the radio
reports airUtilTx 12% from minute 2 to 12; 10 people, every 2 min); 50 people every minute.
Each question's fate, from what the people's radios displayed:
answered within ``busy_max_wait``; answered later (held, or queued behind others); told (a
notice displayed, no answer: busy, try again; expired); still in the outbox at the end; dropped
(nothing displayed, nothing waiting: must be 0). Also answers displayed twice (must be 0), the
time from a question to the first packet its person saw (median, max, how many over
``busy_max_wait``) and RSS at start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import resource
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.app import App, build
from bot.delivery import EXPIRED, HELD
from bot.transports.mesh_airtime import FIRMWARE_CHANNEL_LIMIT, lora_airtime
from bot.transports.meshtastic_holds import NOTICE_BYTES
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import Later
from tests.fakes.mesh_harness import Harness, every, hold_clock_while_busy, mesh_harness

ROOT = Path(__file__).resolve().parents[1]
SPACING = 3.0
FIRMWARE_RETRIES = 3
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
    config = make_config(tmp, llm.base_url, extra)  # limit windows and outbox ages: virtual
    app = await build(config, env={}, transports=[h.transport], clock=h.clock.monotonic)
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
            mesh_harness(
                start=False,
                spacing_seconds=SPACING,
                cooldown=0.0,
                metrics=limit,
                known=tuple(nodes),
            ) as h,
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


@dataclass(frozen=True)
class Soak:
    name: str
    people: int
    every: float  # seconds between one person's questions
    stop_metrics_at: float | None = None  # the radio reports a busy channel, then stops
    tx_spike: tuple[float, float, float] | None = None  # (from, to, airUtilTx percent)
    others_spike: tuple[float, float, float] | None = None  # (from, to, others' channel %)


SOAKS = (
    Soak("metrics every 60 s", 50, 120.0),
    Soak("metrics stop after a busy-channel report at 2 min", 50, 120.0, stop_metrics_at=120.0),
    Soak("duty cycle spent 10 min (airUtilTx 12%)", 10, 120.0, tx_spike=(120.0, 720.0, 12.0)),
    Soak(
        "channel busy 70 min (others 30%), longer than max_age (1 h)",
        10,
        120.0,
        others_spike=(120.0, 4320.0, 30.0),
    ),
    Soak("50 people, one question a minute", 50, 60.0),
)
TAG = re.compile(r"\[q(\d+)\]")


@dataclass
class Fates:
    name: str
    people: int
    questions: int = 0
    answered: int = 0  # within busy_max_wait
    later: int = 0  # answered, later than busy_max_wait (held, or queued behind others)
    told: int = 0  # a notice displayed as the final word, no answer (busy, limits)
    expired: int = 0  # the answer waited past max_age: not sent, the person told
    expiry_notices: int = 0  # "could not send ... in time" notices displayed
    waiting: int = 0  # still in the outbox at the end
    covered: int = 0  # limited within a window whose one notice the person already had
    dropped: int = 0
    twice: int = 0  # answer packets displayed more than once
    first_p50: float = 0.0  # seconds from a question to the first packet its person saw
    first_p95: float = 0.0
    first_max: float = 0.0
    late: int = 0  # first packet after busy_max_wait although the radio could transmit
    impossible: dict[str, int] = field(default_factory=dict)  # ... while it could not: why
    after_room_max: float = 0.0  # those: from the radio able again to their first packet
    in_hold: int = 0  # questions asked while the bot held answers (duty cycle, busy channel)
    hold_told: int = 0  # of those, the person saw a first packet within busy_max_wait
    minutes: float = 0.0  # virtual minutes the scenario ran
    rss_start: int = 0
    rss_end: int = 0


def _tagged(body: dict[str, Any]) -> str:
    found = re.findall(r"q(\d+)\b", str(body["messages"][-1]["content"]))
    return f"[q{found[-1] if found else '?'}] {ANSWER}"


# Why the radio could not put even a notice on air (the world, not the bot's rules):
WHY_NOT = {
    "duty": "the node's hour at its duty cycle: no room for one more notice (the firmware "
    "refuses every packet over it)",
    "channel": f"other nodes over {FIRMWARE_CHANNEL_LIMIT:.0f}% of the channel: the firmware's "
    "own limit (courtesy, not physics)",
}


async def soak(s: Soak, minutes: float, llm: FakeLLM) -> Fates:
    """Run one soak scenario (module docstring) and classify every question's fate."""
    nodes = [0xD0000001 + i for i in range(s.people)]
    llm.reply_fn = _tagged
    fates = Fates(s.name, s.people)
    asked: list[tuple[int, int, float, bool]] = []  # (node, number, time asked, in a hold)
    world: list[tuple[float, str]] = []  # (time, "" or why nothing may go on air then)
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            mesh_harness(
                start=False,
                spacing_seconds=SPACING,
                cooldown=0.0,
                metrics_every=60,
                known=tuple(nodes),  # people's radios announced their NodeInfo
            ) as h,
            _app(Path(tmp), llm, h) as app,
            every(h.clock, 10.0, app.responder.redeliver),
        ):
            hold_clock_while_busy(h, app)
            fates.rss_start = rss_kb()
            t0 = h.clock.monotonic()
            radio = h.radio
            duty = h.config.duty_cycle
            notice_share = 100.0 * lora_airtime(NOTICE_BYTES) / 3600.0  # of the hour, percent

            async def sample() -> None:
                _, tx = radio.device_metrics()
                why = "duty" if tx + notice_share > duty else ""
                if not why and radio.others_util > FIRMWARE_CHANNEL_LIMIT:
                    why = "channel"
                world.append((h.clock.monotonic(), why))

            async def weather() -> None:  # the radio's side of the scenario
                if s.stop_metrics_at is not None:  # its last report: others fill the channel
                    await h.clock.sleep(s.stop_metrics_at)
                    radio.inject_channel_utilization(35.0)
                    radio.stop_reporting()
                if s.tx_spike is not None:
                    start, end, percent = s.tx_spike
                    await h.clock.sleep(start)
                    radio.air_util_tx = percent
                    radio.report_metrics()
                    await h.clock.sleep(end - start)
                    radio.air_util_tx = None  # back to what the node really sent
                if s.others_spike is not None:
                    start, end, percent = s.others_spike
                    await h.clock.sleep(start)
                    radio.inject_channel_utilization(percent)
                    await h.clock.sleep(end - start)
                    radio.inject_channel_utilization(0.0)

            side = asyncio.ensure_future(weather())
            sampler = asyncio.ensure_future(_repeat(h.clock, 5.0, sample))
            schedule = sorted(
                (i * s.every / s.people + k * s.every, node)
                for i, node in enumerate(nodes)
                for k in range(max(1, int(minutes * 60 / s.every)))
            )
            for n, (at, node) in enumerate(schedule):
                while (wait := t0 + at - h.clock.monotonic()) > 0:
                    await h.clock.sleep(wait)
                busy = h.transport.busy()
                radio.inject_text(f"q{n} will it rain at my place?", frm=node)
                held = busy is not None and busy.cause != "queue"
                asked.append((node, n, h.clock.monotonic(), held))
            end = h.clock.monotonic() + 7200.0
            while h.clock.monotonic() < end:  # until every question has settled
                open_rows = await app.store._all(
                    "SELECT count(*) FROM outbox WHERE state = 'pending'"
                )
                unanswered = await app.store._all(
                    "SELECT count(*) FROM messages WHERE role = 'user' AND status = 'pending'"
                )
                stored = await app.store._all("SELECT count(*) FROM messages WHERE role='user'")
                if (
                    stored[0][0] >= len(asked)
                    and open_rows[0][0] == 0
                    and unanswered[0][0] == 0
                    and app.responder.idle
                    and not h.transport._jobs
                    and side.done()
                ):
                    break
                await h.clock.sleep(10.0)
                if int(h.clock.monotonic() - t0) % 600 < 10:
                    print(f"  {s.name}: {(h.clock.monotonic() - t0) / 60:.0f} virtual min, "
                          f"{open_rows[0][0]} waiting", file=sys.stderr)  # fmt: skip
            side.cancel()
            sampler.cancel()
            fates.minutes = (h.clock.monotonic() - t0) / 60.0
            fates.rss_end = rss_kb()
            waiting_people = {
                r[0]
                for r in await app.store._all("SELECT person FROM outbox WHERE state = 'pending'")
            }
            shown = [(t, p.to, p.decoded.payload.decode("utf-8", "replace")) for t, p in
                     radio.shown]  # fmt: skip
            limited = _numbers(
                await app.store._all(
                    "SELECT text FROM messages WHERE role = 'user' AND status = 'limited'"
                )
            )
            expired = _numbers(
                await app.store._all(
                    "SELECT m.text FROM outbox o JOIN messages m ON m.id = o.question_id"
                    " WHERE o.kind = 'answer' AND o.state = 'expired'"
                )
            )
            limit = h.config.busy_max_wait
    for task in (side, sampler):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    _classify(fates, asked, shown, waiting_people, limited, limit, expired)
    _world(fates, asked, shown, world, limit)
    return fates


async def _repeat(clock: Any, seconds: float, step: Any) -> None:
    while True:
        await step()
        await clock.sleep(seconds)


def _numbers(rows: list[Any]) -> set[int]:
    return {int(m.group(1)) for (text,) in rows if (m := re.match(r"q(\d+) ", str(text)))}


def _classify(
    fates: Fates,
    asked: list[tuple[int, int, float, bool]],
    shown: list[tuple[float, int, str]],
    waiting_people: set[str],
    limited: set[int],
    limit: float,
    expired: set[int],
) -> None:
    answers: dict[int, list[float]] = {}
    seen: dict[tuple[int, str], int] = {}
    for t, to, text in shown:
        seen[(to, text)] = seen.get((to, text), 0) + 1
        for tag in TAG.findall(text):
            answers.setdefault(int(tag), []).append(t)
    fates.twice = sum(n - 1 for (_, text), n in seen.items() if TAG.search(text) and n > 1)
    fates.questions = len(asked)
    notices: dict[int, list[float]] = {}
    promises = tuple(text.split(".")[0] for text in HELD.values())  # "your answer is saved"
    for t, to, text in shown:
        if not TAG.search(text) and not text.startswith(promises):  # a final word, no answer
            notices.setdefault(to, []).append(t)
    firsts: list[float] = []
    for node, n, t, held in asked:
        after = [u for u, to, _ in shown if to == node and u >= t]
        first = min(after) - t if after else math.inf
        firsts.append(first)
        fates.in_hold += held
        fates.hold_told += held and first <= limit
        if n in answers:
            if min(answers[n]) - t <= limit:
                fates.answered += 1
            else:
                fates.later += 1
        elif n in expired:  # the answer waited past max_age: not sent; an expiry notice
            fates.expired += 1
            said = [u for u, to, text in shown if to == node and u >= t and text == EXPIRED]
            if said and said[0] in notices.get(node, []):
                notices[node].remove(said[0])
        elif (notice := next((u for u in notices.get(node, []) if u >= t), None)) is not None:
            notices[node].remove(notice)  # one notice tells one question
            fates.told += 1
        elif f"!{node:08x}" in waiting_people:
            fates.waiting += 1
        elif n in limited:  # over a per-person limit: one notice per window covers the rest
            fates.covered += 1
        else:
            fates.dropped += 1
    finite = sorted(f for f in firsts if f < math.inf)
    fates.first_p50 = statistics.median(finite) if finite else math.nan
    fates.first_p95 = finite[min(len(finite) - 1, int(0.95 * len(finite)))] if finite else math.nan
    fates.first_max = max(firsts) if firsts else math.nan
    fates.expiry_notices = sum(1 for _, _, text in shown if text == EXPIRED)


def _world(
    fates: Fates,
    asked: list[tuple[int, int, float, bool]],
    shown: list[tuple[float, int, str]],
    world: list[tuple[float, str]],
    limit: float,
) -> None:
    """A first packet later than ``limit`` after asking: late (the radio could transmit at
    some point in that window), or impossible (it could not, all along: ``WHY_NOT``)."""
    for node, _, t, _ in asked:
        after = [u for u, to, _ in shown if to == node and u >= t]
        first = min(after) if after else math.inf
        if first - t <= limit:
            continue
        window = [why for u, why in world if t <= u <= t + limit]
        if window and all(window) and len(set(window)) == 1:
            why = window[0]
            fates.impossible[why] = fates.impossible.get(why, 0) + 1
            able = next((u for u, w in world if u > t and not w), math.inf)
            fates.after_room_max = max(fates.after_room_max, first - able)
        else:
            fates.late += 1


def soak_table(results: list[Fates]) -> str:
    head = (
        "| scenario | people | questions | answered <= 120 s | held, answered later |"
        " told (notice, no answer) | expired: told (notices) | still in outbox |"
        " limited, covered by the window's notice | dropped | shown twice |"
        " first packet p50 / p95 / max (s) | first packet > 120 s: radio could |"
        " ... radio could not (why; then told within) | asked in a hold: told <= 120 s |"
        " virtual min | RSS start / end (MiB) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for r in results:
        impossible = (
            "; ".join(f"{n} ({WHY_NOT[k].split(':')[0]})" for k, n in r.impossible.items())
            + f"; then told within {r.after_room_max:.0f} s"
            if r.impossible
            else "0"
        )
        rows.append(
            f"| {r.name} | {r.people} | {r.questions} | {r.answered} | {r.later} | {r.told} | "
            f"{r.expired} ({r.expiry_notices}) | {r.waiting} | {r.covered} | {r.dropped} | "
            f"{r.twice} | {r.first_p50:.0f} / {r.first_p95:.0f} / {r.first_max:.0f} | "
            f"{r.late} | {impossible} | {r.hold_told} of {r.in_hold} | {r.minutes:.0f} | "
            f"{r.rss_start / 1024:.0f} / {r.rss_end / 1024:.0f} |"
        )
    return head + "\n".join(rows) + "\n"


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--people", type=int, nargs="+", default=[15, 30])
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="soak: virtual minutes of questions"
    )
    parser.add_argument("--soak", action="store_true", help="every question's fate, 5 scenarios")
    parser.add_argument(
        "--only", type=int, nargs="+", help="soak: run only these scenarios (1-based)"
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="update docs/benchmarks.md's table"
    )
    args = parser.parse_args(argv)
    llm = FakeLLM()
    llm.reply = ANSWER
    await llm.start()
    try:
        if args.soak:
            fates = []
            chosen = [SOAKS[i - 1] for i in args.only] if args.only else SOAKS
            for scenario_ in chosen:
                fates.append(await soak(scenario_, args.minutes, llm))
                print(soak_table(fates[-1:]).splitlines()[-1], file=sys.stderr)
            text = soak_table(fates)
            print(text)
            if args.write_docs:
                _write_docs(text, marker="mesh_soak")
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


def _write_docs(text: str, doc: Path | None = None, *, marker: str = "mesh_load") -> None:
    """Replace the table between the ``marker`` markers of ``doc`` (docs/benchmarks.md)."""
    doc = doc or ROOT / "docs" / "benchmarks.md"
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    body = doc.read_text(encoding="utf-8")
    if begin not in body:
        raise SystemExit(f"{doc} has no {begin} marker")
    head, rest = body.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(head + begin + "\n" + text + end + tail, encoding="utf-8")


if __name__ == "__main__":
    asyncio.run(main())
