"""Smoke test for ``bench/memory_tiers``: seeding and the measured runs work at toy size.

No timing asserts (a shared machine); the benchmark itself prints what it measured."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from pathlib import Path

from bench.corpus import generate_database
from bench.memory_tiers import run, seed_tiers, table


def test_toy_run_seeds_sessions_and_answers_every_turn(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    generate_database(source, messages=600, conversations=6, seed=2, quiet=True)
    probe = tmp_path / "probe.db"
    probe.write_bytes(source.read_bytes())
    seed_tiers(probe, sessions=5)
    db = sqlite3.connect(probe)
    try:
        assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 30
        assert db.execute("SELECT count(*) FROM longterm_summaries").fetchone()[0] == 6
        overlaps = db.execute(
            "SELECT count(*) FROM sessions a JOIN sessions b ON a.conversation_id = "
            "b.conversation_id AND a.id < b.id AND a.last_message_id >= b.first_message_id"
        ).fetchone()[0]
        assert overlaps == 0
    finally:
        db.close()
    args = argparse.Namespace(sessions=[0, 5], turns=6, active=3, warmup=1, seed=2)
    results = asyncio.run(run(source, tmp_path, args))
    assert [n for n, _ in results] == [0, 5]
    for _n, r in results:
        assert r.turns == 6 and r.replies_sent == r.replies_persisted == 7
    assert "| 5 |" in table(results)
