"""Crash harness: the real ``meshsage run`` process (default interface factory, unmodified
TCPInterface) against the fake radio and the fake LLM over HTTP, killed with SIGKILL at random
moments while several people wait, then with SIGTERM while 20 replies wait.

What must hold afterwards, checked in the database and on the air:
- every stored question has exactly one answer (one assistant turn, one outbox row), and that
  row ended ``delivered`` (or ``expired``);
- every part of every delivered answer went on air to its person and was shown exactly once:
  no answer shown twice, no answer lost. A kill between the radio taking a part and the
  database recording it makes the restart write that part again, with the packet id stored
  before the first write; the receiving radio drops the repeat (``fake_radio``: as the
  firmware, by sender and packet id), so it costs airtime (counted, at most one per kill) but
  is never shown twice.

Spacing is 2.6 s (the radio checks the 2.1 s firmware floor on its own read times, so the
margin absorbs a loaded machine). The seed is printed on failure (``CRASH_SEED`` replays a
run). Wall-clock waits here are hang guards, not timing assertions.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bot.transports.mesh_text import render_parts, split_parts
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import FakeTcpRadio
from tests.test_cli import _env

KILLS = int(os.environ.get("CRASH_KILLS", "20"))
PEOPLE = [0xC0DE0001 + i for i in range(6)]


def _answer(body: dict[str, Any]) -> str:
    # The newest question in the last message: it may also carry recalled older turns (a recall
    # note), whose questions have lower numbers; the answer must name the one being answered,
    # or two answers would read alike and look like one shown twice.
    asked = re.findall(r"q(\d+) (long|short)", body["messages"][-1]["content"])
    num, kind = max(asked, key=lambda a: int(a[0]))
    question = f"q{num} {kind}"
    if "long" in question:  # every part names its question: two answers never share a part
        tail = " ".join(f"Detail {i} of {question}." for i in range(10))
        return f"About {question}: {tail}"
    return f"About {question}: fine."


async def _start(config: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", "--config", str(config),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip


async def _connected(radio: FakeTcpRadio, before: int, proc: asyncio.subprocess.Process) -> bool:
    for _ in range(600):  # hang guard (30 s)
        if radio.connections > before and radio.conn is not None:
            return True
        if proc.returncode is not None:
            return False
        await asyncio.sleep(0.05)
    return False


def _db(state: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{state / 'meshsage.db'}?mode=ro", uri=True, timeout=5)


def _settled(state: Path) -> bool:
    path = state / "meshsage.db"
    if not path.exists():
        return False
    with _db(state) as db:
        open_questions = db.execute(
            "SELECT count(*) FROM messages WHERE role = 'user' AND status = 'pending'"
        ).fetchone()[0]
        open_rows = db.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()[0]
    return bool(open_questions == 0 and open_rows == 0)


def _check(
    state: Path,
    radio: FakeTcpRadio,
    *,
    kills: int,
    seed: int,
    open_ok: bool = False,
    report: bool = False,
) -> int:
    """The invariants of the module docstring; returns how many answers went out.
    ``open_ok``: rows may still be pending (kept for the next run), but then none of their
    parts may have been recorded twice."""
    with _db(state) as db:
        questions = db.execute(
            "SELECT m.id, m.status, c.person FROM messages m JOIN conversations c "
            "ON c.id = m.conversation_id WHERE m.role = 'user'"
        ).fetchall()
        answers = Counter(
            r[0] for r in db.execute("SELECT parent_id FROM messages WHERE role = 'assistant'")
        )
        rows = db.execute(
            "SELECT question_id, text, state, person, detail FROM outbox WHERE kind = 'answer'"
        ).fetchall()
    per_question = Counter(r[0] for r in rows)
    shown = Counter((p.to, bytes(p.decoded.payload).decode()) for _, p in radio.shown)
    for qid, status, person in questions:
        where = f"question {qid} of {person} (seed {seed})"
        assert status == "answered", f"{where}: {status}"
        # a question a later turn folded into its prompt is answered by that turn's answer
        folded = answers[qid] == per_question[qid] == 0 and any(
            later > qid and p == person and answers[later] == 1 for later, _, p in questions
        )
        assert folded or (answers[qid] == 1 and per_question[qid] == 1), (
            f"{where}: not exactly one answer"
        )
    doubles = 0
    out = 0
    # "sent": every part was accepted by the radio but the ACK died with a killed process
    final = ("delivered", "sent", "expired", *(("pending",) if open_ok else ()))
    for _qid, text, row_state, person, detail in rows:
        assert row_state in final, (person, row_state, detail, seed)
        if row_state not in ("delivered", "sent"):
            continue
        out += 1
        dest = int(person[1:], 16)
        for part in render_parts(split_parts(text, chunk_bytes=200, max_parts=3)):
            count = shown[(dest, part)]
            assert count >= 1, f"a delivered part never reached {person} (seed {seed})"
            doubles += count - 1
    assert doubles == 0, f"{doubles} part(s) shown twice over {kills} kills (seed {seed})"
    written_again = len(radio.repeats)
    assert written_again <= kills, f"{written_again} repeats for {kills} kills (seed {seed})"
    if report:  # the figures (pytest -s shows them)
        print(
            f"crash harness: {kills} kills, {out} answers out, {doubles} shown twice, "
            f"{written_again} repeat(s) on air dropped by the receiver (seed {seed})"
        )
    return out


async def test_sigkill_at_random_moments_then_every_question_has_one_delivered_answer(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    fake_llm.reply_fn = _answer
    radio = FakeTcpRadio()
    config = tmp_path / "meshsage.yaml"
    config.write_text(
        "bot: {rate_limit: {messages: 100, per_seconds: 60}, queue_limit: 50}\n"
        f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}, "
        "spacing_seconds: 2.6, cooldown: 0, stale_after: 0, reconnect_initial: 0.2}\n"
    )
    env = _env(tmp_path, fake_llm)
    state = tmp_path / "state"
    asked = 0
    try:
        for kill in range(KILLS):
            before = radio.connections
            proc = await _start(config, env)
            if kill % 5 == 0:  # people write while the bot runs; it dies under them
                if await _connected(radio, before, proc):
                    await asyncio.sleep(0.3)  # the library finishes its handshake
                    for num in rng.sample(PEOPLE, 2):
                        asked += 1
                        kind = "long" if rng.random() < 0.25 else "short"
                        radio.inject_text(f"q{asked} {kind}", frm=num)
                await asyncio.sleep(rng.uniform(0.0, 1.5))
            else:  # any moment from start-up (migrations, recovery) to sending
                await asyncio.sleep(rng.uniform(0.2, 3.2))
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        before = radio.connections
        proc = await _start(config, env)  # the last run: everything still owed goes out
        assert await _connected(radio, before, proc)
        for _ in range(1200):  # hang guard (60 s)
            if _settled(state):
                break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        radio.stop()
    checked = _check(state, radio, kills=KILLS, seed=seed, report=True)
    assert asked == 0 or checked > 0, f"nothing was answered (seed {seed})"


async def test_sigterm_with_twenty_replies_waiting_loses_nothing(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _answer
    radio = FakeTcpRadio()
    config = tmp_path / "meshsage.yaml"
    config.write_text(
        f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}, "
        "spacing_seconds: 2.6, cooldown: 0, stale_after: 0, outbox_limit: 50}\n"
    )
    env = _env(tmp_path, fake_llm)
    state = tmp_path / "state"
    people = [0xD0000001 + i for i in range(20)]
    try:
        proc = await _start(config, env)
        assert await _connected(radio, 0, proc)
        await asyncio.sleep(0.3)
        for i, num in enumerate(people):
            radio.inject_text(f"q{i} short", frm=num)
        for _ in range(400):  # hang guard: until every answer is stored (in the outbox)
            if (state / "meshsage.db").exists():
                with _db(state) as db:
                    n = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
                if n == len(people):
                    break
            await asyncio.sleep(0.05)
        on_air_at_term = len(radio.on_air)
        proc.send_signal(signal.SIGTERM)  # 20 replies x 2.1 s of airtime are still waiting
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert on_air_at_term < len(people)  # replies really were waiting
        with _db(state) as db:
            waiting = db.execute("SELECT count(*) FROM outbox WHERE state = 'pending'")
            assert waiting.fetchone()[0] > 0  # kept, not dropped
        sent_before = _check(state, radio, kills=0, seed=0, open_ok=True)
        before = radio.connections
        proc = await _start(config, env)  # the kept replies go out after the restart
        assert await _connected(radio, before, proc)
        for _ in range(600):  # hang guard (30 s): three more, then stop again (CI time)
            if _check(state, radio, kills=0, seed=0, open_ok=True) >= sent_before + 3:
                break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        radio.stop()
    # nothing lost (every question has its one row: delivered, or pending for the next run),
    # nothing sent twice, and the restart went on where the first run stopped
    assert _check(state, radio, kills=0, seed=0, open_ok=True, report=True) >= sent_before + 3
    assert len(fake_llm.chat_requests()) == len(people)  # each answered once, never again
