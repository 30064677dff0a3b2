"""Forgetting by use: the least retrieved, oldest raw turns go first, never pinned turns or the
sources of pinned facts; summaries and sessions stay; every deletion takes its index and
vector rows (rows counted in every table)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bot.domain import ConversationKey
from bot.memory.store import SqliteStore
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

KEY = ConversationKey("mesh", "!0000abcd")


def _rows(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        tables = [r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND name NOT IN ('messages_fts', 'schema_migrations')")]  # fmt: skip
        out = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
        out["orphan vectors"] = db.execute(
            "SELECT count(*) FROM message_vectors v LEFT JOIN messages m ON m.id = v.message_id "
            "WHERE m.id IS NULL").fetchone()[0]  # fmt: skip
        return out
    finally:
        db.close()


async def test_forgetting_keeps_pinned_and_used_turns_and_leaves_no_orphan_rows(
    store: SqliteStore,
) -> None:
    conv = await store.conversation(KEY)
    ids = [
        await store.add_message(conv.id, role="user" if i % 2 == 0 else "assistant",
                                author="a", text=f"turn number {i} zebra", tokens=4,
                                status="answered", created_at=1e9 + i)
        for i in range(20)
    ]  # fmt: skip
    await store.add_vectors([(i, conv.id, "m", [1.0, 0.0]) for i in ids])
    await store.mark_important(conv.id, [ids[0]])  # !pin
    await store.add_fact(conv.id, text="pinned", tokens=1, source_ids=[ids[1]])
    await store.add_fact(conv.id, text="extracted", tokens=1, pinned=False, source_ids=[ids[2]])
    await store.note_retrieved([ids[3]])  # used once: outlives unused newer turns
    await store.save_summary(conv.id, text="sum", first_message_id=ids[0],
                             last_message_id=ids[10], tokens=1)  # fmt: skip
    await store.add_session(conv.id, first_message_id=ids[0], last_message_id=ids[10],
                            started_at=1e9, ended_at=1e9 + 10, messages=11)  # fmt: skip
    other = await store.conversation(ConversationKey("mesh", "!beef"))
    await store.add_message(other.id, role="user", author="b", text="bob", tokens=1,
                            status="answered")  # fmt: skip

    assert await store.prune_by_use(10) == 10
    kept = {m.id for m in await store.all_messages(conv.id)}
    assert {ids[0], ids[1], ids[3]} <= kept  # pinned, source of a pinned fact, used
    assert ids[2] not in kept  # an extracted fact's source is not protected
    assert set(ids[13:]) <= kept  # the newest unused survive; the oldest unused went first
    rows = _rows(store.path)
    assert rows["messages"] == 11 and rows["message_vectors"] == 10  # bob's has no vector
    assert rows["messages_fts_docsize"] == 11 and rows["orphan vectors"] == 0
    assert (rows["summaries"], rows["sessions"], rows["facts"]) == (1, 1, 2)
    # Use only delays forgetting; pinned turns and pinned facts' sources are never pruned.
    assert await store.prune_by_use(1) == 8
    assert {m.id for m in await store.all_messages(conv.id)} == {ids[0], ids[1]}
    assert len(await store.all_messages(other.id)) == 1


async def test_pin_marks_the_latest_exchange_and_retrieval_counts_uses(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "noted"
    h = await start_harness(
        tmp_path,
        fake_llm,
        transport=FakeTransport(context_tokens=300),
        extra="bot:\n  rate_limit:\n    messages: 1000\n    per_seconds: 1\n",
    )
    try:
        await h.say("my locker code is 4471 remember")
        for i in range(30):
            await h.say(f"unrelated chatter {i} about the weather and more words here")
        await h.say("!pin")  # no reply: the latest exchange
        conv = await h.store.conversation(h.transport_key("alice"))
        db = sqlite3.connect(h.store.path)
        pinned = db.execute("SELECT count(*) FROM messages WHERE important = 1").fetchone()[0]
        assert pinned == 2
        await h.say("what is my locker code?")
        used = db.execute(
            "SELECT uses FROM messages WHERE text = 'my locker code is 4471 remember'"
        ).fetchone()[0]
        db.close()
        assert used >= 1  # retrieved into the prompt, so counted
        assert conv.id
    finally:
        await h.app.close()


async def test_pin_on_a_reply_marks_that_message(tmp_path: Path, fake_llm: FakeLLM) -> None:
    from bot.domain import Inbound

    fake_llm.reply = "the answer worth keeping"
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.say("question one")
        await h.say("question two")
        conv = await h.store.conversation(h.transport_key("alice"))
        first_answer = next(m for m in await h.store.all_messages(conv.id) if m.role == "assistant")
        assert first_answer.platform_id is not None
        pin = Inbound(transport="fake", sender="alice", text="!pin",
                      reply_to=first_answer.platform_id, authenticated=True)  # fmt: skip
        result = await h.app.commands.run(pin, "pin", "")
        assert result.text.startswith("Pinned 1 message")
        db = sqlite3.connect(h.store.path)
        rows = db.execute("SELECT id FROM messages WHERE important = 1").fetchall()
        db.close()
        assert rows == [(first_answer.id,)]
    finally:
        await h.app.close()
