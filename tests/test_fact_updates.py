"""Facts update: a new value for the same subject replaces the old one (kept in the fact's
history, shown by !facts), for !remember, for extracted facts and through a linked account;
the person is told what changed; !reset says which facts it keeps and why; !forget takes a
fact's history with it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app import App, build
from bot.domain import ConversationKey
from bot.llm.tokens import make_counter
from bot.memory import fact_values
from bot.memory.facts import FactExtractor, Proposal, is_near_duplicate
from bot.memory.store import SqliteStore
from tests.conftest import Harness, make_config, start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

MANY = "bot:\n  rate_limit:\n    messages: 1000\n    per_seconds: 1\n"


def _last(h: Harness) -> str:
    return h.transport.texts()[-1]


def test_subjects_and_values() -> None:
    assert fact_values.split("my door code is 7788 at the north gate") == (
        "door code", "7788 at the north gate",
    )  # fmt: skip
    assert fact_values.same_subject("my wife is called Maria", "The person's wife is called Anna.")
    assert not fact_values.same_subject("I am vegetarian", "I am a nurse")  # no subject: a pronoun
    assert not fact_values.same_subject("I live in Porto", "I live in Oslo")  # no copula
    assert fact_values.change_line("my door code is 4521", "my door code is 7788") == (
        "door code: 4521 -> 7788"
    )
    assert not is_near_duplicate("my door code is 4521", "my door code is 4522")


async def test_remember_a_new_value_updates_the_fact_and_says_what_changed(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    harness = await start_harness(tmp_path, fake_llm, extra=MANY)
    try:
        await _remember_and_update(harness)
    finally:
        await harness.app.close()


async def _remember_and_update(harness: Harness) -> None:
    harness.llm.reply = "ok"
    await harness.say("!remember my door code is 4521")
    await harness.say("!remember my wife is called Anna")
    await harness.say("!remember my door code is 7788 at the north gate")
    assert _last(harness) == (
        "Updated fact 1: door code: 4521 -> 7788 at the north gate (the old value stays in its "
        "history, !facts)."
    )
    await harness.say("!remember my wife is called Maria")
    assert _last(harness).startswith("Updated fact 2: wife: Anna -> Maria")
    await harness.say("!remember my wife is called Maria")
    assert _last(harness) == "I already have that as fact 2: my wife is called Maria"
    await harness.say("!facts")
    assert _last(harness) == (
        '1) my door code is 7788 at the north gate [you, today; was "4521" (you, until today)] '
        '2) my wife is called Maria [you, today; was "Anna" (you, until today)]'
    )
    await harness.say("who is my wife?")
    system = harness.llm.chat_requests()[-1]["messages"][0]["content"]
    assert "7788" in system and "Maria" in system
    assert "4521" not in system and "Anna" not in system  # the old values reach no prompt


async def test_extraction_updates_an_inferred_fact_by_subject_never_a_pinned_one(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    conv = await store.conversation(ConversationKey("console", "ana"))
    said = await store.add_message(conv.id, role="user", author="ana", text="my wife Maria says hi",
                                   tokens=5, status="x")  # fmt: skip
    old = await store.add_fact(conv.id, text="The person's wife is called Anna.", tokens=8,
                               pinned=False, source_ids=[said])  # fmt: skip
    await store.add_fact(conv.id, text="my door code is 4521", tokens=6)  # pinned
    extractor = FactExtractor(store=store, llm=None, counter=make_counter(), max_facts=10)  # type: ignore[arg-type]
    [msg] = await store.messages_by_ids([said])
    applied = await extractor.apply(
        conv.id,
        [Proposal("add", "The person's wife is called Maria."),
         Proposal("add", "Their door code is 9999.")],
        [msg],
    )  # fmt: skip
    assert (applied.added, applied.updated, applied.ignored) == (0, 1, 1)
    facts = {f.id: f for f in await store.facts(conv.id)}
    assert facts[old].text == "The person's wife is called Maria."
    assert [(h.text, h.pinned, h.source_ids) for h in facts[old].history] == [
        ("The person's wife is called Anna.", False, (said,))
    ]
    assert [f.text for f in facts.values() if f.pinned] == ["my door code is 4521"]


async def test_reset_drops_inferred_facts_keeps_pinned_and_says_why(harness: Harness) -> None:
    harness.llm.reply = "ok"
    await harness.say("!remember I live in Oslo")
    conv = await harness.store.conversation(harness.transport_key("alice"))
    await harness.store.add_fact(conv.id, text="Alice has a dog.", tokens=5, pinned=False)
    await harness.say("!reset")
    assert _last(harness) == (
        "Fresh start: nothing said before now is used again. Kept: 1 fact you asked me to "
        "remember (!facts). Dropped: 1 fact I had inferred. Old messages stay stored "
        "(!forget deletes them)."
    )
    await harness.say("hello again")
    system = harness.llm.chat_requests()[-1]["messages"][0]["content"]
    assert "I live in Oslo" in system and "dog" not in system


@pytest.fixture
async def linked(
    tmp_path: Path, fake_llm: FakeLLM
) -> AsyncIterator[tuple[App, FakeTransport, FakeTransport]]:
    mesh, discord = FakeTransport(name="mesh"), FakeTransport(name="discord")
    config = make_config(tmp_path, fake_llm.base_url, MANY)
    app = await build(config, env={}, transports=[mesh, discord])
    await app.start()
    yield app, mesh, discord
    await app.close()


async def test_an_update_through_a_linked_account_and_forget_takes_the_history(
    linked: tuple[App, FakeTransport, FakeTransport], fake_llm: FakeLLM
) -> None:
    app, mesh, discord = linked

    async def say(t: FakeTransport, text: str, sender: str) -> str:
        await t.say(text, sender=sender)
        await app.responder.wait_idle()
        return t.texts()[-1]

    fake_llm.reply = "ok"
    await say(mesh, "!remember my door code is 4521", "!1234abcd")
    code = (await say(mesh, "!link", "!1234abcd")).split("code is ")[1][:6]
    assert (await say(discord, f"!link {code}", "1001")).startswith("Linked")
    reply = await say(discord, "!remember my door code is 7788", "1001")
    assert reply.startswith("Updated fact 1: door code: 4521 -> 7788")
    assert 'was "4521"' in await say(mesh, "!facts", "!1234abcd")
    assert isinstance(app.store, SqliteStore)
    db = app.store._db  # the raw rows: the old value is in the fact's history column
    rows = await (await db.execute("SELECT history FROM facts")).fetchall()
    assert ["4521" in json.dumps(r[0]) for r in rows] == [True]
    for who, t in (("!1234abcd", mesh), ("1001", discord)):
        await say(t, "!forget", who)
        await say(t, "!forget yes", who)
    [(left,)] = await (await db.execute("SELECT count(*) FROM facts")).fetchall()
    assert left == 0
