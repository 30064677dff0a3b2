"""Crash harness: the real ``meshsage run`` process (default interface factory, unmodified
TCPInterface) against the fake radio and the fake LLM over HTTP, disrupted while people DM it,
on both stores (SQLite in the state dir; PostgreSQL from tests/pg_server.py, one gateway).

Disruptions (``test_no_answer_shown_twice_or_lost``, one per parameter), each followed by a
last run that lets everything still owed go out, then a SIGTERM:
- ``kill -9``: ``CRASH_KILLS`` (default 6) SIGKILLs at random moments, from start-up
  (migrations, recovery) to sending; every fifth run (the first and the sixth) people write
  first; the other kills fall one in each equal slice of 0.2-3.2 s after the start (``_slice``),
  so even the default size kills early in start-up and late, while answers are sent;
- ``SIGTERM``: ``CRASH_TERMS`` (default 3) runs, each: two people write, SIGTERM at a random
  moment (model call, storing, sending: one run in each third of 0-2.5 s); the process must
  exit 0 within systemd's 45 s;
- ``link loss``: one process; ``CRASH_DROPS`` (default 3: one of each kind) times two people
  write, and once their questions are stored the fake radio drops the TCP connection (the
  first loss as soon as a part is on air: mid-send; the second after a random pause; then
  either, at random), either briefly (even losses) or gone for 0.5-3 s (odd ones); the bot
  reconnects. The last loss ends with a SIGTERM while the radio is gone (the stop must not
  wait for it).
The defaults keep CI short (docs/development.md, "Test suite time"); the sizes of earlier
sessions (``CRASH_KILLS=12 CRASH_TERMS=5 CRASH_DROPS=8``) or larger are one variable away.
``test_sigterm_with_twenty_replies_waiting_loses_nothing``: SIGTERM while 20 replies wait; kept
in the outbox, sent after the restart.

What must hold afterwards, checked in the store and on the air:
- every stored question has exactly one answer of its own (one assistant turn, one outbox
  row; several waiting questions are never folded into one answer), and that row ended
  ``delivered``, ``sent`` (the ACK died with a killed process) or ``expired``; with link
  loss every question asked was stored and answered;
- every part of every delivered answer went on air to its person and was shown exactly once:
  no answer shown twice, no answer lost. A kill between the radio taking a part and the
  store recording it makes the restart write that part again, with the packet id stored
  before the first write; the receiving radio drops the repeat (``fake_radio``: as the
  firmware, by sender and packet id), so it costs airtime (counted: at most one per kill or
  stop; with link loss a lost ACK also makes one, reported) but is never shown twice.

The channel courtesy limits are set out of the way (``busy_threshold: 90``, ``duty_cycle:
100``; tests/test_mesh_courtesy.py covers them): at the default 20% the many long answers of a
run would wait minutes for their airtime. Spacing is 2.6 s (the radio checks the 2.1 s
firmware floor on its own read times, so the margin absorbs a loaded machine). The seed is
printed on failure (``CRASH_SEED`` replays a run); ``pytest -s`` prints each run's figures.
Wall-clock waits here are hang guards, not timing assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

import pytest

from bot.transports.mesh_text import render_parts, split_parts
from tests import pg_server
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import FakeTcpRadio
from tests.test_cli import _env

KILLS = int(os.environ.get("CRASH_KILLS", "6"))
TERMS = int(os.environ.get("CRASH_TERMS", "3"))
DROPS = int(os.environ.get("CRASH_DROPS", "3"))
PEOPLE = [0xC0DE0001 + i for i in range(6)]
STOP_GUARD = 45.0  # systemd's TimeoutStopSec (systemd/meshsage.service): then it kills


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


@dataclass
class _Backend:
    """The bot's store, read from outside the process (read-only SQLite, or PostgreSQL)."""

    name: str
    state: Path
    url: str | None = None
    _pg: Any = None

    def yaml(self) -> str:
        if self.url is None:
            return ""
        return (
            f"storage: {{url: '{self.url}', password_env: {pg_server.PASSWORD_ENV}, "
            "gateway: crash-harness}\n"
        )

    def env(self, tmp_path: Path, llm: FakeLLM) -> dict[str, str]:
        env = _env(tmp_path, llm)
        if self.url is not None:
            env[pg_server.PASSWORD_ENV] = pg_server.BOT_PASSWORD
        return env

    async def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql``; none while the bot has not created its tables yet."""
        if self.url is None:
            path = self.state / "meshsage.db"
            if not path.exists():
                return []
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
            with contextlib.closing(db):
                try:
                    return [tuple(r) for r in db.execute(sql).fetchall()]
                except sqlite3.OperationalError as exc:
                    if "no such table" in str(exc):
                        return []
                    raise
        import asyncpg

        if self._pg is None:
            self._pg = await asyncpg.connect(self.url, password=pg_server.BOT_PASSWORD)
        try:
            return [tuple(r) for r in await self._pg.fetch(sql)]
        except asyncpg.UndefinedTableError:
            return []

    async def count(self, sql: str) -> int:
        rows = await self.rows(sql)
        return int(rows[0][0]) if rows else 0

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()


@pytest.fixture(params=["sqlite", "postgresql"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[_Backend]:
    url = None
    if request.param == "postgresql":
        pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")
        url = request.getfixturevalue("url")
    b = _Backend(request.param, tmp_path / "state", url)
    yield b
    await b.close()


@dataclass
class _Bot:
    """The real process, restarted as often as a test needs; stderr of each run in a file."""

    config: Path
    env: dict[str, str]
    logs: Path
    proc: asyncio.subprocess.Process | None = None
    runs: int = 0
    stops: list[float] = field(default_factory=list)  # seconds each SIGTERM took
    _err: IO[bytes] | None = None

    async def start(self) -> asyncio.subprocess.Process:
        self.runs += 1
        self._close_log()
        self._err = (self.logs / f"run{self.runs}.log").open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", "run", "--config", str(self.config),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=self._err, env=self.env,
        )  # fmt: skip
        return self.proc

    async def up(self, radio: FakeTcpRadio) -> None:
        """Start and wait until the bot's node is connected."""
        before = radio.connections
        proc = await self.start()
        assert await _connected(radio, before, proc), self.tail()

    def tail(self) -> str:
        return (self.logs / f"run{self.runs}.log").read_text(errors="replace")[-2000:]

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        self.proc = None

    async def terminate(self, guard: float = STOP_GUARD) -> None:
        """SIGTERM; the process must exit 0 (``guard``: a hang guard, systemd's stop timeout)."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), guard)
        except TimeoutError:
            raise AssertionError(
                f"SIGTERM: still running after {guard:.0f} s\n{self.tail()}"
            ) from None
        self.stops.append(time.monotonic() - t0)
        assert self.proc.returncode == 0, self.tail()
        self.proc = None

    def _close_log(self) -> None:
        if self._err is not None:
            self._err.close()
            self._err = None

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await self.kill()
        self._close_log()


async def _connected(radio: FakeTcpRadio, before: int, proc: asyncio.subprocess.Process) -> bool:
    for _ in range(1800):  # hang guard (90 s: a start-up on a loaded machine is slow)
        if radio.connections > before and radio.conn is not None:
            return True
        if proc.returncode is not None:
            return False
        await asyncio.sleep(0.05)
    return False


async def _until(cond: Callable[[], Awaitable[bool]], what: str, guard: float = 30.0) -> None:
    """Poll the async predicate ``cond`` (a hang guard, not a timing assertion)."""
    end = time.monotonic() + guard
    while time.monotonic() < end:
        if await cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


OPEN_QUESTIONS = "SELECT count(*) FROM messages WHERE role = 'user' AND status = 'pending'"
OPEN_ROWS = "SELECT count(*) FROM outbox WHERE state = 'pending'"
QUESTIONS = "SELECT count(*) FROM messages WHERE role = 'user'"


async def _settled(db: _Backend) -> bool:
    tables = await db.rows("SELECT count(*) FROM outbox")
    return bool(tables) and await db.count(OPEN_QUESTIONS) == 0 and await db.count(OPEN_ROWS) == 0


async def _check(
    db: _Backend,
    radio: FakeTcpRadio,
    *,
    what: str,
    repeat_bound: int | None,
    open_ok: bool = False,
) -> tuple[int, int, int]:
    """The invariants of the module docstring; returns (questions stored, each with an answer
    of its own; answers out; repeats dropped by receivers). ``open_ok``: rows may still be
    pending (kept for the next run), but then none of their parts may have been shown twice."""
    questions = await db.rows(
        "SELECT m.id, m.status, c.person FROM messages m JOIN conversations c "
        "ON c.id = m.conversation_id WHERE m.role = 'user'"
    )
    answers = Counter(
        r[0] for r in await db.rows("SELECT parent_id FROM messages WHERE role = 'assistant'")
    )
    rows = await db.rows(
        "SELECT question_id, text, state, person, detail FROM outbox WHERE kind = 'answer'"
    )
    per_question = Counter(r[0] for r in rows)
    own = 0  # questions with an answer of their own
    shown = Counter((p.to, bytes(p.decoded.payload).decode()) for _, p in radio.shown)
    for qid, status, person in questions:
        where = f"question {qid} of {person} ({what})"
        if open_ok and status == "pending":
            continue
        assert status == "answered", f"{where}: {status}"
        # its own answer: never folded into a later question's (issue 28 point 3)
        assert answers[qid] == 1 and per_question[qid] == 1, (
            f"{where}: not exactly one answer of its own ({answers[qid]} turns, "
            f"{per_question[qid]} rows)"
        )
        own += 1
    doubles = 0
    out = 0
    # "sent": every part was accepted by the radio but the ACK died with a killed process
    final = ("delivered", "sent", "expired", *(("pending",) if open_ok else ()))
    for _qid, text, row_state, person, detail in rows:
        assert row_state in final, (person, row_state, detail, what)
        if row_state not in ("delivered", "sent"):
            continue
        out += 1
        dest = int(person[1:], 16)
        for part in render_parts(split_parts(text, chunk_bytes=200, max_parts=3)):
            count = shown[(dest, part)]
            assert count >= 1, f"a delivered part never reached {person} ({what}): {part!r}"
            doubles += count - 1
    assert doubles == 0, f"{doubles} part(s) shown twice ({what})"
    repeats = len(radio.repeats)
    if repeat_bound is not None:
        assert repeats <= repeat_bound, f"{repeats} repeats on air for {repeat_bound} ({what})"
    assert own == len(questions) or open_ok, f"{own} of {len(questions)} answered ({what})"
    return len(questions), out, repeats


def _ask(radio: FakeTcpRadio, rng: random.Random, asked: int, *, long: float = 0.25) -> int:
    """Two people write one question each; returns the new count of questions asked."""
    for num in rng.sample(PEOPLE, 2):
        asked += 1
        kind = "long" if rng.random() < long else "short"
        radio.inject_text(f"q{asked} {kind}", frm=num)
    return asked


def _slice(rng: random.Random, i: int, n: int, lo: float, hi: float) -> float:
    """A random moment in the ``i``-th of ``n`` equal slices of [lo, hi]: over ``n`` runs
    every part of the range is hit once, however small ``n`` is."""
    width = (hi - lo) / max(n, 1)
    return rng.uniform(lo + (i % max(n, 1)) * width, lo + (i % max(n, 1) + 1) * width)


async def _kill_runs(bot: _Bot, radio: FakeTcpRadio, rng: random.Random) -> int:
    asked = 0
    quiet = [k for k in range(KILLS) if k % 5 != 0]  # the runs killed at a moment from start
    order = rng.sample(range(len(quiet)), len(quiet))  # which slice each of them gets
    for kill in range(KILLS):
        before = radio.connections
        proc = await bot.start()
        if kill % 5 == 0:  # people write while the bot runs; it dies under them
            if await _connected(radio, before, proc):
                await asyncio.sleep(0.3)  # the library finishes its handshake
                asked = _ask(radio, rng, asked)
            await asyncio.sleep(rng.uniform(0.0, 1.5))
        else:  # any moment from start-up (migrations, recovery) to sending
            await asyncio.sleep(_slice(rng, order[quiet.index(kill)], len(quiet), 0.2, 3.2))
        await bot.kill()
    return asked


async def _term_runs(bot: _Bot, radio: FakeTcpRadio, rng: random.Random) -> int:
    asked = 0
    order = rng.sample(range(TERMS), TERMS)
    for term in range(TERMS):
        await bot.up(radio)
        await asyncio.sleep(0.3)
        asked = _ask(radio, rng, asked)
        # the model call, storing, or sending
        await asyncio.sleep(_slice(rng, order[term], TERMS, 0.0, 2.5))
        await bot.terminate()
    return asked


async def _link_losses(bot: _Bot, radio: FakeTcpRadio, rng: random.Random, db: _Backend) -> int:
    asked = 0
    before = radio.connections
    proc = await bot.start()
    for drop in range(DROPS):
        assert await _connected(radio, before, proc), bot.tail()  # (re)connected
        await asyncio.sleep(0.3)
        on_air = len(radio.on_air)
        asked = _ask(radio, rng, asked, long=0.5)
        await _until(partial(_at_least, db, QUESTIONS, asked), "the questions stored")
        mid_send = drop == 0 or (drop != 1 and rng.random() < 0.5)
        if mid_send:  # as soon as a part of an answer is on air
            await _until(partial(_more_on_air, radio, on_air), "a part on air")
        else:
            await asyncio.sleep(rng.uniform(0.0, 2.0))
        before = radio.connections
        if drop == DROPS - 1:  # the node is gone and the bot is stopped meanwhile
            radio.stop()
            await asyncio.sleep(1.0)
            await bot.terminate()
            radio.restart()
            proc = await bot.start()
        elif drop % 2 == 0:  # a dropped connection: the bot reconnects at once
            radio.drop_connection()
        else:  # the node reboots: gone for a while, then back on the same port
            radio.stop()
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            radio.restart()
    return asked


async def _at_least(db: _Backend, sql: str, n: int) -> bool:
    return await db.count(sql) >= n


async def _more_on_air(radio: FakeTcpRadio, n: int) -> bool:
    return len(radio.on_air) > n


def _crash_config(tmp_path: Path, radio: FakeTcpRadio, backend: _Backend) -> Path:
    """The bot's config for a run against ``radio``: limits high enough that pacing, not the
    rate limit, decides what is on air when the process dies."""
    config = tmp_path / "meshsage.yaml"
    config.write_text(
        "bot: {rate_limit: {messages: 100, per_seconds: 60}, queue_limit: 50}\n"
        f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}, "
        "spacing_seconds: 2.6, cooldown: 0, stale_after: 0, reconnect_initial: 0.2, "
        "busy_threshold: 90, duty_cycle: 100}\n" + backend.yaml()
    )
    return config


@pytest.mark.parametrize("disruption", ["kill -9", "SIGTERM", "link loss"])
async def test_no_answer_shown_twice_or_lost(
    disruption: str, backend: _Backend, tmp_path: Path, fake_llm: FakeLLM
) -> None:
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    fake_llm.reply_fn = _answer
    radio = FakeTcpRadio()
    config = _crash_config(tmp_path, radio, backend)
    bot = _Bot(config, backend.env(tmp_path, fake_llm), tmp_path)
    what = f"{disruption} on {backend.name}, seed {seed}"
    rounds = {"kill -9": KILLS, "SIGTERM": TERMS, "link loss": DROPS}[disruption]
    try:
        if disruption == "kill -9":
            asked = await _kill_runs(bot, radio, rng)
        elif disruption == "SIGTERM":
            asked = await _term_runs(bot, radio, rng)
        else:
            asked = await _link_losses(bot, radio, rng, backend)
        if bot.proc is None:  # the last run: everything still owed goes out
            await bot.up(radio)
        with contextlib.suppress(AssertionError):  # _check below says what is missing
            await _until(lambda: _settled(backend), "everything answered and sent", 90.0)
        await bot.terminate(30.0)  # nothing in flight: a quick stop
    finally:
        await bot.close()
        radio.stop()
    # repeats: at most one per kill or stop; a link loss can also lose ACKs (reported)
    bound = None if disruption == "link loss" else rounds + 1
    stored, out, repeats = await _check(backend, radio, what=what, repeat_bound=bound)
    if disruption == "link loss":
        assert stored == asked, f"{asked} questions asked, {stored} stored ({what})"
    assert asked == 0 or out > 0, f"nothing was answered ({what})"
    print(
        f"crash harness ({what}): {rounds} disruptions, {asked} asked, {stored} stored, "
        f"{stored} of them with an answer of their own, "
        f"{out} answers out, 0 shown twice, {repeats} repeat(s) on air dropped by the "
        f"receiver; SIGTERM took at most {max(bot.stops):.1f} s"
    )


async def test_sigterm_with_twenty_replies_waiting_loses_nothing(
    backend: _Backend, tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _answer
    radio = FakeTcpRadio()
    config = tmp_path / "meshsage.yaml"
    config.write_text(
        f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}, "
        "spacing_seconds: 2.6, cooldown: 0, stale_after: 0, outbox_limit: 50}\n" + backend.yaml()
    )
    bot = _Bot(config, backend.env(tmp_path, fake_llm), tmp_path)
    what = f"SIGTERM with 20 waiting on {backend.name}"
    people = [0xD0000001 + i for i in range(20)]
    try:
        await bot.up(radio)
        await asyncio.sleep(0.3)
        for i, num in enumerate(people):
            radio.inject_text(f"q{i} short", frm=num)
        # until every answer is stored (in the outbox)
        await _until(
            lambda: _at_least(backend, "SELECT count(*) FROM outbox", len(people)),
            "every answer stored",
        )
        on_air_at_term = len(radio.on_air)
        await bot.terminate()  # 20 replies x 2.1 s of airtime are still waiting
        assert on_air_at_term < len(people)  # replies really were waiting
        assert await backend.count(OPEN_ROWS) > 0  # kept, not dropped
        _, sent_before, _ = await _check(backend, radio, what=what, repeat_bound=1, open_ok=True)
        await bot.up(radio)  # the kept replies go out after the restart

        async def three_more() -> bool:  # then stop again (CI time)
            _, out, _ = await _check(backend, radio, what=what, repeat_bound=2, open_ok=True)
            return out >= sent_before + 3

        await _until(three_more, "three more answers out")
        await bot.terminate()
    finally:
        await bot.close()
        radio.stop()
    # nothing lost (every question has its one row: delivered, or pending for the next run),
    # nothing sent twice, and the restart went on where the first run stopped
    _, out, repeats = await _check(backend, radio, what=what, repeat_bound=2, open_ok=True)
    assert out >= sent_before + 3
    assert len(fake_llm.chat_requests()) == len(people)  # each answered once, never again
    print(f"crash harness ({what}): {out} answers out, 0 shown twice, {repeats} repeat(s)")


async def test_kill_with_questions_waiting_gives_each_its_own_answer(
    backend: _Backend, tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Three people send four questions each while the model is stuck on the first; kill -9;
    after the restart every question has an answer of its own, in each person's order (before:
    each person's waiting questions were folded into their latest, one answer for four)."""
    fake_llm.reply_fn = _answer
    fake_llm.script = [("sleep", 60.0)]  # the first call hangs until the kill
    radio = FakeTcpRadio()
    config = tmp_path / "meshsage.yaml"
    config.write_text(
        "bot: {rate_limit: {messages: 100, per_seconds: 60}, queue_limit: 50}\n"
        f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}, "
        "spacing_seconds: 2.6, cooldown: 0, stale_after: 0, busy_threshold: 90, "
        "duty_cycle: 100, outbox_limit: 50}\n" + backend.yaml()
    )
    bot = _Bot(config, backend.env(tmp_path, fake_llm), tmp_path)
    what = f"kill -9 with 12 questions waiting on {backend.name}"
    people = PEOPLE[:3]
    asked = 0
    try:
        await bot.up(radio)
        await asyncio.sleep(0.3)
        for _round in range(4):
            for num in people:
                asked += 1
                radio.inject_text(f"q{asked} short", frm=num)
        await _until(partial(_at_least, backend, QUESTIONS, asked), "the questions stored")
        await bot.kill()
        fake_llm.script = []
        await bot.up(radio)
        with contextlib.suppress(AssertionError):  # _check below says what is missing
            await _until(lambda: _settled(backend), "everything answered and sent", 120.0)
        await bot.terminate(30.0)
    finally:
        await bot.close()
        radio.stop()
    stored, out, _ = await _check(backend, radio, what=what, repeat_bound=2)
    assert stored == asked == 12 and out == 12, (stored, out)
    order = await backend.rows(  # each person's answers went out in the order asked
        "SELECT o.person, o.question_id FROM outbox o WHERE o.kind = 'answer' ORDER BY o.id"
    )
    for num in people:
        mine = [q for p, q in order if p == f"!{num:08x}"]
        assert mine == sorted(mine), (num, mine)
    print(f"crash harness ({what}): {stored} stored, {stored} with an answer of their own")
