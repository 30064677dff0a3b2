"""Forged-stranger flood: what junk DMs from invented node ids cost the bot (issue 44.8). Not
a test.

Run: ``python -m bench.forged_flood [--forged 20 30] [--write-docs]``.

What runs: the real app (responder, SQLite store, the real openai client over HTTP to the fake
LLM) with the real Meshtastic transport and the unmodified library ``TCPInterface`` against the
fake radio, on the virtual clock of the tests. ``forged`` DMs arrive at once, each from a node
id no radio has (the fake radio's ``ghosts``: nobody ACKs a DM to one, and the local firmware
reports ``MAX_RETRANSMIT`` after its own three retransmissions, as the firmware does). 60 s
later a real person (Alice: in the radio's node DB, her radio ACKs) asks a question.

Reported per flood (virtual seconds, LoRa LongFast time on air):
- writes to forged ids (every packet the bot wrote to one, re-sends included);
- seconds on air for them: each write's time on air x (1 + the firmware's 3 retransmissions:
  none is ever ACKed), and that as a share of the hourly budget (``duty_cycle``, 10% in the
  EU: 360 s an hour);
- amplification: those seconds / the attacker's own time on air (one packet per forged DM);
- forged ids that got any packet (answer or notice; the others got nothing: the allowance
  for unconfirmed senders was spent);
- Alice's first packet and her answer's first packet: seconds from her question to the first
  packet the bot wrote to her (a notice counts) and to the first part of her answer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.mesh_load import ANSWER, SPACING, _app, _write_docs
from bot.transports.mesh_airtime import HOUR, lora_airtime
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE
from tests.fakes.mesh_harness import hold_clock_while_busy, mesh_harness

FIRMWARE_RETRIES = 3
QUESTION = "what is the weather tomorrow?"
REAL_AFTER = 60.0  # seconds after the flood that the real person asks


@dataclass
class Flood:
    forged: int
    writes: int
    on_air: float  # seconds, firmware retransmissions included
    budget_share: float  # of the hour's duty-cycle airtime
    amplification: float
    answered: int  # forged ids that got at least one packet
    real_first: float  # seconds from the real person's question to her first packet
    real_answer: float  # ... to the first part of her answer


async def flood(forged: int, llm: FakeLLM) -> Flood:
    ghosts = [0xF0000001 + i for i in range(forged)]
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            mesh_harness(start=False, spacing_seconds=SPACING, cooldown=0.0) as h,
            _app(Path(tmp), llm, h) as app,
        ):
            hold_clock_while_busy(h, app)
            for num in ghosts:
                h.radio.forge_text(QUESTION, frm=num)
            await h.clock.sleep(REAL_AFTER)
            asked = h.clock.monotonic()
            h.radio.inject_text("will it rain at my place?", frm=ALICE)
            for _ in range(20_000):  # hang guard: until every question and reply settled
                open_rows = await app.store._all(
                    "SELECT count(*) FROM outbox WHERE state = 'pending'"
                )
                unanswered = await app.store._all(
                    "SELECT count(*) FROM messages WHERE role = 'user' AND status = 'pending'"
                )
                # forged DMs arrive without PKI: answered from no memory, stored nowhere
                # (meshtastic.unauthenticated_dm: chat), so Alice's answer on air is the mark
                alice_answered = any(
                    p.to == ALICE and p.decoded.payload.decode() in ANSWER
                    for _, p in h.radio.sent_texts()
                )
                if (
                    alice_answered
                    and open_rows[0][0] == 0
                    and unanswered[0][0] == 0
                    and app.responder.idle
                    and not h.transport._jobs
                ):
                    break
                await h.clock.sleep(5.0)
            sent = h.radio.sent_texts()
            duty = h.config.duty_cycle
    to_ghosts = [p for _, p in sent if p.to in set(ghosts)]
    on_air = sum(lora_airtime(len(p.decoded.payload)) * (1 + FIRMWARE_RETRIES) for p in to_ghosts)
    attacker = forged * lora_airtime(len(QUESTION.encode()))
    firsts = [t for t, p in sent if p.to == ALICE]
    answers = [t for t, p in sent if p.to == ALICE and p.decoded.payload.decode() in ANSWER]
    return Flood(
        forged=forged,
        writes=len(to_ghosts),
        on_air=on_air,
        budget_share=on_air / (duty / 100.0 * HOUR),
        amplification=on_air / attacker,
        answered=len({p.to for p in to_ghosts}),
        real_first=(firsts[0] - asked) if firsts else float("inf"),
        real_answer=(answers[0] - asked) if answers else float("inf"),
    )


def table(results: list[Flood], *, label: str) -> str:
    head = (
        "| code | forged DMs | writes to forged ids | seconds on air (firmware retransmissions"
        " included) | share of the hourly duty-cycle budget | amplification | forged ids that"
        " got a packet | real person: first packet / first answer part (s after asking) |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {label} | {r.forged} | {r.writes} | {r.on_air:.0f} | {r.budget_share:.0%} | "
        f"{r.amplification:.1f}x | {r.answered} | {r.real_first:.0f} / {r.real_answer:.0f} |"
        for r in results
    ]
    return head + "\n".join(rows) + "\n"


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forged", type=int, nargs="+", default=[20, 30])
    parser.add_argument("--label", default="this code", help="the first column of the table")
    parser.add_argument(
        "--write-docs", action="store_true", help="update docs/benchmarks.md's table"
    )
    args = parser.parse_args(argv)
    llm = FakeLLM()
    llm.reply = ANSWER
    await llm.start()
    try:
        results = []
        for n in args.forged:
            results.append(await flood(n, llm))
            print(table(results[-1:], label=args.label).splitlines()[-1], file=sys.stderr)
        text = table(results, label=args.label)
        print(text)
        if args.write_docs:
            _write_docs(text, marker="forged_flood")
    finally:
        await llm.stop()


if __name__ == "__main__":
    asyncio.run(main())
