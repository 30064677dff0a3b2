"""Smoke test for ``bench/pipeline``: its machinery runs at toy size and reports sane numbers.

No timing asserts: this only proves that generation, the fake LLM, both strategies and the
bookkeeping work, so the real (1M-message) run does not fail after minutes of generation.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
from pathlib import Path

import pytest

from bench.corpus import TextGen, conversation_sizes, generate_database
from bench.pipeline import (
    DB_NAME,
    MARK_END,
    MARK_START,
    STRATEGIES,
    RunResult,
    detail_table,
    drive,
    reply_maker,
    table,
    write_docs,
)
from tests.fakes.fake_llm import FakeLLM

TURNS = 20
WARMUP = 2


def test_generator_is_seeded_and_sizes_add_up() -> None:
    import random

    a, b = TextGen(seed=7), TextGen(seed=7)
    assert a.user_message(random.Random(1)) == b.user_message(random.Random(1))
    sizes = conversation_sizes(random.Random(2), messages=2000, conversations=20)
    assert sum(sizes) == 2000 and all(s >= 2 and s % 2 == 0 for s in sizes)


def test_toy_run_answers_every_turn(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    stats = generate_database(source, messages=2000, conversations=20, seed=3, quiet=True)
    assert stats.messages == 2000
    db = sqlite3.connect(source)
    try:
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 2000
        # The FTS triggers ran: the index finds generated words.
        assert db.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'the'")
    finally:
        db.close()

    async def serve_all() -> tuple[list[RunResult], int]:
        fake = FakeLLM()
        fake.reply_fn = reply_maker(3)
        await fake.start()
        try:
            results = []
            for strategy in STRATEGIES:
                state = tmp_path / strategy
                state.mkdir()
                shutil.copyfile(source, state / DB_NAME)
                results.append(
                    await drive(
                        state_dir=state,
                        strategy=strategy,
                        base_url=fake.base_url,
                        turns=TURNS,
                        active=5,
                        warmup=WARMUP,
                        seed=3,
                    )
                )
            return results, len(fake.chat_requests())
        finally:
            await fake.stop()

    results, requests = asyncio.run(serve_all())
    for r in results:
        assert r.turns == TURNS
        assert r.messages_in_db == 2000
        assert r.replies_sent == r.replies_persisted == r.questions_answered == TURNS + WARMUP
        assert 0 < r.overhead_p50_ms <= r.overhead_p99_ms <= r.overhead_max_ms
        assert r.turns_per_s > 0 and r.peak_rss_mb > 0 and r.avg_prompt_chars > 0
    # Each turn made exactly one reply call (drive() raises otherwise); the background calls
    # counted are those answered. A background call cut at the stop or preempted may still
    # have reached the server (so: at least).
    assert requests >= sum(TURNS + WARMUP + r.summaries_refreshed for r in results)

    docs = tmp_path / "pipeline.md"
    docs.write_text(f"# Title\n\nintro\n\n{MARK_START}\nSTALE-TABLE\n{MARK_END}\n\nfindings\n")
    args = argparse.Namespace(
        messages=2000, conversations=20, turns=TURNS, active=5, warmup=WARMUP, seed=3,
        context_tokens=2048,
    )  # fmt: skip
    write_docs(docs, args, results)
    text = docs.read_text()
    assert "intro" in text and "findings" in text and "STALE-TABLE" not in text
    assert table(results) in text and detail_table(results) in text
    headline = tmp_path / "benchmarks.md"
    headline.write_text(f"## Performance\n\n{MARK_START}\nSTALE\n{MARK_END}\n\nTargets\n")
    write_docs(headline, args, results, detail=False)
    text = headline.read_text()
    assert "## Performance" in text and "Targets" in text and "STALE" not in text
    assert table(results) in text and detail_table(results) not in text


def test_benchmarks_performance_section_shows_the_latest_table() -> None:
    root = Path(__file__).resolve().parent.parent

    def generated(path: Path) -> str:
        text = path.read_text(encoding="utf-8")
        assert text.count(MARK_START) == 1 and text.count(MARK_END) == 1, path
        return text.split(MARK_START, 1)[1].split(MARK_END, 1)[0]

    bench = (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "\n## Performance\n" in bench
    assert bench.index("## Performance") < bench.index(MARK_START)
    ours, docs = (
        generated(root / "docs" / "benchmarks.md"),
        generated(root / "docs" / "pipeline.md"),
    )
    assert "Command: `python -m bench.pipeline" in ours
    assert "| ours |" in ours and "| naive |" in ours
    assert docs.startswith(ours.rstrip("\n"))  # same run: command, machine and headline table


def test_tables_are_written_only_when_asked_and_only_from_a_full_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.pipeline import parse_args

    assert parse_args([]).write_docs is False  # a plain run publishes nothing
    assert parse_args(["--write-docs"]).write_docs is True  # the full, default run may
    for small in (["--messages", "2000"], ["--turns", "5"], ["--strategies", "naive"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--write-docs", *small])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "needs a full run" in err and small[0] in err


def test_the_gateways_table_reports_each_round_and_the_median_ratio(tmp_path: Path) -> None:
    """``--rounds``: each round's SQLite and 1-gateway p50 and their ratio, then the median;
    README is never written (its performance section links docs/benchmarks.md)."""
    from bench import gateways

    def run(n: int, p50: float) -> gateways.GatewayRun:
        return gateways.GatewayRun(n, 100, 1000, p50, 2 * p50, 10.0, 10.0 / n)

    rounds = [(run(1, 10.0), run(1, 20.0)), (run(1, 10.0), run(1, 12.0)), (run(1, 8.0), run(1, 12))]
    text = gateways.table([rounds[-1][1], run(2, 30.0)], rounds[-1][0], rounds)
    assert "| SQLite | 1 | 8.00 |" in text and "| PostgreSQL | 2 | 30.00 |" in text
    assert "2.00x, 1.20x, 1.50x" not in text  # each round is shown with its figures
    assert "10.00 / 20.00 ms = 2.00x" in text and "8.00 / 12.00 ms = 1.50x" in text
    assert "Median ratio 1.50x" in text and "SQLite in the last round: overhead p50 1.50x" in text
    docs = tmp_path / "benchmarks.md"
    docs.write_text(f"a\n{gateways.MARK_START}\nold\n{gateways.MARK_END}\nb\n")
    readme = (Path(gateways.__file__).parent.parent / "README.md").read_text()
    args = argparse.Namespace(
        messages=1000, conversations=10, turns=100, active=10, gateways="1,2", warmup=5,
        seed=1, server_version="15", load=(1.0, 1.5), rounds_measured=rounds,
    )  # fmt: skip
    gateways.write_docs(docs, args, [rounds[-1][1]], rounds[-1][0])
    assert "Median ratio 1.50x" in docs.read_text() and "old" not in docs.read_text()
    assert (Path(gateways.__file__).parent.parent / "README.md").read_text() == readme
