"""The same prompt on both backends (issue 19): for the same history, the model receives
byte-identical prompts whether memory is SQLite or PostgreSQL.

Two whole apps (``bot.app.build``) run side by side, one on a SQLite file, one on a real
PostgreSQL server as the bot's role, each with its own fake LLM server reached over HTTP by the
real client. A scripted conversation long enough that older turns leave the recent window and
come back through retrieval is played to both, turn by turn; every chat request must be the same
bytes. The script repeats whole exchanges word for word, so retrieval meets exact score ties
(broken by the newer turn, ``retrieval._rank_key``), and includes words that stem, fold
(diacritics, hyphens, e-mail addresses) and match the date line.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import App, build
from bot.config import RetrievalConfig
from bot.domain import ConversationKey
from bot.memory.context import RETRIEVED_HEADER
from bot.memory.retrieval import Retriever
from tests import pg_server
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

pytest.importorskip("asyncpg", reason="PostgreSQL tests need meshsage[postgres]")

FIXED = (
    "bot:\n  system_prompt: You are a test bot.\n"
    "  rate_limit:\n    messages: 1000\n    per_seconds: 1\n"
    "memory:\n  summary:\n    enabled: false\n  extract_facts: false\n"
    # Recall held to what the server reads in a few seconds depends on each fake server's
    # measured speed, which a loaded machine makes differ between the two apps: unbounded here,
    # since this test compares the backends, not the time limit (tests/test_gate_rates.py).
    "  retrieval:\n    recall_seconds: null\n"
)
SCRIPT = [
    "my cat Biscuit loves tuna fish",
    "I am running the café on Main-Street",
    "write to me at anna.lee@example.org please",
    "the boiler makes a knocking noise at night",
    "we planted tomatoes and basil in March",
    "my cat Biscuit loves tuna fish",  # the same exchange again: an exact tie
    "Naïve question: is the résumé ready?",
    "tomorrow we are driving to the coast",
    "the printer on floor two jams every morning",
    "my sister visits on the weekend",
    "the router blinks orange since yesterday",
    "I ran three miles before breakfast",
    "our dog Pepper chews the sofa",
    "the bank called about the mortgage",
    "my cat Biscuit loves tuna fish",  # and a third time
    "remember the boiler knocking?",
    "what does Biscuit love to eat?",
    "who runs the cafe on main street?",
    "what is my e-mail address?",
    "resume status?",
    "did we plant anything in march?",
    "tell me about the printer and the router",
    "what does Biscuit love to eat?",
]


def _reply(body: dict[str, Any]) -> str:
    """A deterministic answer that echoes the question (so answers are searchable too)."""
    return "Noted: " + str(body["messages"][-1]["content"])[:80]


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[list[App], list[FakeLLM]]]:
    server = pg_server.shared()
    database = server.new_database()
    apps: list[App] = []
    llms: list[FakeLLM] = []
    try:
        for name, extra in (
            ("sqlite", ""),
            (
                "postgres",
                f"storage:\n  url: '{server.url(database)}'\n"
                f"  password_env: {pg_server.PASSWORD_ENV}\n",
            ),
        ):
            llm = FakeLLM()
            llm.reply_fn = _reply
            await llm.start()
            llms.append(llm)
            home = tmp_path / name
            (home / "state").mkdir(parents=True)  # (PostgreSQL alone would not create it)
            config = make_config(home, llm.base_url, FIXED + extra)
            env = {pg_server.PASSWORD_ENV: pg_server.BOT_PASSWORD}
            app = await build(config, env=env, transports=[FakeTransport(context_tokens=600)])
            await app.start()
            apps.append(app)
        yield apps, llms
    finally:
        for app in apps:
            await app.close()
        for llm in llms:
            await llm.stop()
        server.drop_database(database)


async def test_both_backends_send_byte_identical_prompts(
    pair: tuple[list[App], list[FakeLLM]],
) -> None:
    apps, llms = pair
    for text in SCRIPT:
        for app in apps:  # interleaved, so both see the same minute on the clock
            transport = app.transports[0]
            assert isinstance(transport, FakeTransport)
            await transport.say(text, sender="alice")
            await app.responder.wait_idle()
    prompts = [[json.dumps(r["messages"]) for r in llm.chat_requests()] for llm in llms]
    assert len(prompts[0]) == len(SCRIPT)
    assert prompts[0] == prompts[1]
    recalled = [p for p in prompts[0] if RETRIEVED_HEADER[:20] in p]
    assert recalled, "the script is too short: retrieval never ran"
    assert any("tuna" in p for p in recalled[-1:])
    # Said a third time, the line recalls neither its repeats nor the answers to them (issue
    # 17: a repeat adds nothing); the question about it later does recall them.
    third = llms[0].chat_requests()[SCRIPT.index("my cat Biscuit loves tuna fish", 6)]
    final = str(third["messages"][-1]["content"])
    assert final.endswith("my cat Biscuit loves tuna fish")
    assert "tuna" not in final[: -len("my cat Biscuit loves tuna fish")]


async def test_ranking_ties_break_the_same_way(pair: tuple[list[App], list[FakeLLM]]) -> None:
    apps, _llms = pair
    for text in SCRIPT[:16]:
        for app in apps:
            transport = app.transports[0]
            assert isinstance(transport, FakeTransport)
            await transport.say(text, sender="alice")
            await app.responder.wait_idle()
    ranked = []
    for app in apps:
        conv = await app.store.conversation(ConversationKey(app.transports[0].name, "alice"))
        retriever = Retriever(store=app.store, counter=app.counter, config=RetrievalConfig())
        found, _outline, _span = await retriever.rank(
            conv, "what does Biscuit love to eat?", before_id=1 << 62
        )
        ranked.append([(r.id, r.score) for r in found])
    assert ranked[0] == ranked[1]
    scores = [s for _id, s in ranked[0]]
    tied = [i for i in range(len(scores) - 1) if scores[i] == scores[i + 1]]
    assert tied, ranked[0]  # the repeated exchange really ties
    for i in tied:  # and the newer turn comes first
        assert ranked[0][i][0] > ranked[0][i + 1][0]


async def test_stemming_agrees_on_short_words_and_doubled_consonants(tmp_path: Path) -> None:
    """Where PostgreSQL's Snowball porter used to differ from FTS5's (words under three letters,
    step 1b's doubled consonants): PostgreSQL now stems in Python with FTS5's own rules
    (012_fts5_porter_stems, tests/test_porter.py), so both find the same messages."""
    from bot.memory.sqlite import SqliteStore

    lite = await SqliteStore.open(tmp_path / "m.db")
    pg = await pg_server.open_store()
    key = ConversationKey("mesh", "!0000abcd")
    texts = ["we used it", "tell us more", "they trekked far", "a trek"]
    terms = ["used", "us", "trekked", "trek"]
    try:
        found = []
        for store in (lite, pg):
            conv = await store.conversation(key)
            for text in texts:
                await store.add_message(conv.id, role="user", author="a", text=text, tokens=3,
                                        status="sent")  # fmt: skip
            found.append(await store.search_terms(conv.id, terms, after_id=0, before_id=1 << 62))
        assert found[0] == found[1]
    finally:
        await lite.close()
        await pg.close()
