"""Finished outbox rows (answers' and commands' text) are pruned after their hour with the
default config (no retention set), and a fact's text leaves the outbox with !unremember."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import bot.app
from bot.memory.keep import OUTBOX_KEEP_SECONDS
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM

MANY = "bot:\n  rate_limit:\n    messages: 1000\n    per_seconds: 1\n"


async def test_finished_rows_go_after_their_hour_without_retention_settings(
    tmp_path: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bot.app, "MAINTENANCE_INTERVAL", 0.02)
    h = await start_harness(tmp_path, fake_llm, extra=MANY)
    try:
        assert h.app.config.memory.retention_days == 0
        assert h.app.config.memory.max_turns_per_person == 0
        fake_llm.reply = "the answer"
        await h.say("a question")
        await h.say("another question")
        db = h.store._db
        [(n,)] = await (await db.execute("SELECT count(*) FROM outbox")).fetchall()
        assert n == 2
        await db.execute(  # the first answer finished more than an hour ago
            "UPDATE outbox SET updated_at = updated_at - ? WHERE id = (SELECT min(id) FROM "
            "outbox)", (OUTBOX_KEEP_SECONDS + 60,),
        )  # fmt: skip
        await db.commit()
        for _ in range(500):
            [(n,)] = await (await db.execute("SELECT count(*) FROM outbox")).fetchall()
            if n == 1:
                break
            await asyncio.sleep(0.02)
        assert n == 1  # the recent one stays (!more, replies to its parts)
    finally:
        await h.app.close()


async def test_unremember_takes_the_facts_text_out_of_the_outbox(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, extra=MANY)
    try:
        await h.say("!remember my locker code is 5150")
        await h.say("!remember I like tea")
        await h.say("!facts")
        db = h.store._db
        rows = await (await db.execute("SELECT text FROM outbox")).fetchall()
        assert sum("5150" in r[0] for r in rows) == 1  # the !facts reply
        await h.say("!unremember 1")
        assert h.transport.texts()[-1] == "Removed fact 1 and its history; 1 left (!facts)."
        rows = await (await db.execute("SELECT text FROM outbox")).fetchall()
        assert not any("5150" in r[0] for r in rows)
        assert sum(r[0].startswith("Noted as fact") for r in rows) == 2  # others stay
    finally:
        await h.app.close()
