"""Bad input gets a clear answer and loses nothing (issue 2), the cases not covered elsewhere.

Every case runs through real parts: the app wired by ``bot.app.build`` on a real SQLite file,
the real openai client over HTTP to the fake LLM, and the CLI in a subprocess where the exit
code and stderr are the answer. The other cases live next to the feature they exercise
(test_responder, test_commands, test_store, test_cli, test_llm_client).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.answering import unavailable_notice
from bot.app import build
from bot.config import load_config
from bot.domain import ConversationKey, ReplyKind
from bot.errors import StorageError
from bot.memory.context import recall_weight
from bot.memory.store import SqliteStore
from bot.responder import EMPTY
from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport
from tests.test_cli import _env, _meshsage

KEY = ConversationKey("console", "alice")
PAGE = 4096


async def _user_texts(h: Harness, sender: str = "alice") -> list[str]:
    rows = await h.store._all(
        "SELECT m.text FROM messages m JOIN conversations c ON c.id = m.conversation_id "
        "WHERE c.person = ? AND m.role = 'user' ORDER BY m.id",
        (sender,),
    )
    return [r[0] for r in rows]


async def _damaged_database(path: Path) -> None:
    """A real database whose header is intact but whose pages 3-6 are overwritten."""
    store = await SqliteStore.open(path)
    conv = await store.conversation(KEY)
    for i in range(300):
        await store.add_message(conv.id, role="user", author="a", text=f"filler {i} " * 30,
                                tokens=1, status="answered")  # fmt: skip
    await store.close()
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")  # the file's own page size (header offset 16)
    assert page in (1024, PAGE) and len(data) > 8 * page
    data[3 * page : 7 * page] = b"\x5a" * (4 * page)
    path.write_bytes(bytes(data))
    with sqlite3.connect(path) as con:  # the header still says "SQLite format 3"
        assert con.execute("PRAGMA quick_check(1)").fetchone()[0] != "ok"


# --- storage ----------------------------------------------------------------------------------
async def test_database_with_damaged_pages_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    await _damaged_database(path)
    try:
        store = await SqliteStore.open(path)
    except StorageError as exc:
        message = str(exc)
    else:
        await store.close()  # an open connection's thread would keep the test run alive
        pytest.fail("a database with damaged pages was opened")
    assert "damaged" in message and "move the file aside" in message and str(path) in message


async def test_cli_with_a_damaged_database_exits_3_without_traceback(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    await _damaged_database(tmp_path / "state" / "meshsage.db")
    rc, out, err = await _meshsage("chat", env=_env(tmp_path, fake_llm), stdin=b"hello\n")
    assert rc == 3, err
    assert "is damaged" in err and "move the file aside" in err and "Traceback" not in err
    assert out == "" and fake_llm.chat_requests() == []


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """An existing directory this process cannot write to (immutable when running as root)."""
    d = tmp_path / "state"
    d.mkdir()
    immutable = False
    if os.geteuid() == 0:  # root ignores permission bits
        immutable = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
        if not immutable:
            pytest.skip("running as root without chattr: cannot make a read-only directory")
    else:
        d.chmod(0o555)
    try:
        yield d
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(d)], check=True)
        d.chmod(0o755)


async def test_existing_but_unwritable_state_dir_says_how_to_fix(
    read_only_dir: Path, tmp_path: Path, fake_llm: FakeLLM
) -> None:
    with pytest.raises(StorageError) as err:
        await SqliteStore.open(read_only_dir / "meshsage.db")
    assert "not writable" in str(err.value) and "MESHSAGE_STATE_DIR" in str(err.value)
    assert list(read_only_dir.iterdir()) == []
    env = _env(tmp_path, fake_llm) | {"MESHSAGE_STATE_DIR": str(read_only_dir)}
    rc, _, err_text = await _meshsage("chat", env=env, stdin=b"hello\n")
    # refused by the preflight (exit 2) before the store would fail to open it (exit 3)
    assert rc == 2 and "not writable" in err_text and "Traceback" not in err_text


# --- messages ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["", " ", "\n\t\r\n", "\x00", "\x00\x07\x1b\x7f", "\r\x00 \x08"], ids=repr
)
async def test_messages_with_nothing_printable_get_a_hint(harness: Harness, text: str) -> None:
    await harness.say(text)
    assert [(r.kind, r.text) for r in harness.transport.sent] == [
        (ReplyKind.NOTICE, EMPTY.format(prefix="!"))
    ]
    assert await _user_texts(harness) == [] and harness.llm.chat_requests() == []


@pytest.mark.parametrize(
    "unit", ["😀", "日本語", "שָׁלוֹם ", "👩‍👩‍👧"], ids=["emoji", "cjk", "hebrew", "zwj"]
)
async def test_100kb_of_multibyte_text_is_stored_whole_and_cut_for_the_model(
    harness: Harness, unit: str
) -> None:
    text = unit * (100_000 // len(unit.encode()))
    assert len(text.encode()) > 99_000
    harness.llm.reply = "ok"
    await harness.say(text)
    assert await _user_texts(harness) == [text.strip()]  # only outer white space goes
    answer = harness.transport.sent[-1]
    assert answer.kind is ReplyKind.ANSWER and answer.note is not None  # says it read a part
    sent = harness.llm.chat_requests()[-1]["messages"][-1]["content"]
    assert len(sent.encode()) < 20_000
    assert sent.encode().decode() == sent  # valid UTF-8 all the way: no half character


# A turn said long ago, pushed out of the recent window by later chat, must be found again by
# retrieval when the question around its key word is full of SQL and FTS5 syntax.
FTS_QUESTIONS = [
    'what is my "kayak called',
    "kayak* name?",
    "NEAR(kayak name",
    "NEAR(kayak, name, 2)",
    "OR kayak OR AND NOT",
    "body:kayak meta:alice",
    "{body meta}: kayak",
    "^kayak - name +",
    "kayak'); DROP TABLE messages; --",
]
WEAK_QUESTIONS = {"body:kayak meta:alice", "kayak'); DROP TABLE messages; --"}


FILLER_TURNS = 30


@pytest.fixture
async def long_chat(tmp_path: Path, fake_llm: FakeLLM) -> AsyncIterator[Harness]:
    """Two memorable turns, then enough stored chat to push them out of a 400-token window."""
    h = await start_harness(tmp_path, fake_llm, transport=FakeTransport(context_tokens=400))
    try:
        conv = await h.store.conversation(h.transport_key("alice"))
        said = ["my kayak is named Bluebird", "and my bike is called مرحبا 🚲"] + [
            f"unrelated weather talk number {i} about clouds, rain, wind and fog"
            for i in range(FILLER_TURNS)
        ]
        for text in said:
            for role, words in (("user", text), ("assistant", "noted")):
                await h.store.add_message(conv.id, role=role, author=role, text=words,
                                          tokens=h.app.counter.count(words),
                                          status="answered")  # fmt: skip
        fake_llm.reply = "noted"
        await h.say("nice weather today")
        window = fake_llm.chat_requests()[-1]["messages"]
        assert "Bluebird" not in " ".join(m["content"] for m in window)  # not in the window
        yield h
    finally:
        await h.app.close()


@pytest.mark.parametrize("question", FTS_QUESTIONS)
async def test_fts5_and_sql_syntax_in_a_question_still_retrieves(
    long_chat: Harness, question: str
) -> None:
    long_chat.llm.reply = "answer"
    conv = await long_chat.store.conversation(long_chat.transport_key("alice"))
    ranked, _, _ = await long_chat.app.context.inner._retriever.rank(
        conv, question, before_id=2**62
    )
    kayak = [m.id for m in await long_chat.store.recent_messages(conv, limit=10_000)
             if m.text == "my kayak is named Bluebird"]  # fmt: skip
    # The syntax reaches the index as plain words: the kayak turn is found.
    assert kayak[0] in [r.id for r in ranked], question
    await long_chat.say(question)
    assert long_chat.transport.texts()[-1] == "answer"
    final = long_chat.llm.chat_requests()[-1]["messages"][-1]["content"]  # recalled turns
    # Recall is spent by match strength (bot.memory.context): a question whose words mostly
    # match nothing (one word of four) is weak, and gets little or no recall.
    if question in WEAK_QUESTIONS:
        assert recall_weight(ranked[0].score) < 0.1, ranked[0]
    else:
        assert "my kayak is named Bluebird" in final
    assert (await _user_texts(long_chat))[-1] == question  # stored exactly
    assert (await long_chat.store.stats())["messages"] == 2 * (FILLER_TURNS + 4)


@pytest.mark.parametrize("question", ["what about مرحبا?", "where is my 🚲 bike"])
async def test_rtl_and_emoji_words_are_searchable(long_chat: Harness, question: str) -> None:
    conv = await long_chat.store.conversation(long_chat.transport_key("alice"))
    ranked, _, _ = await long_chat.app.context.inner._retriever.rank(
        conv, question, before_id=2**62
    )
    bike = [m.id for m in await long_chat.store.recent_messages(conv, limit=10_000)
            if m.text == "and my bike is called مرحبا 🚲"]  # fmt: skip
    assert ranked[0].id == bike[0], ranked[:3]  # found first, through the index
    long_chat.llm.reply = "answer"
    await long_chat.say(question)
    assert long_chat.transport.texts()[-1] == "answer"
    assert (await _user_texts(long_chat))[-1] == question  # stored exactly
    # Whether the turn also reaches this prompt depends on the room a 400-token budget leaves
    # once the background fold has (or has not yet) written its chapter: the bike turn costs
    # more tokens than the ~60 left after a fold. Recall into the prompt is tested at real
    # budgets in test_recall_fill.py / test_recall_notes.py.


# --- the LLM ----------------------------------------------------------------------------------
async def test_hanging_llm_gets_the_apology_and_keeps_the_question(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"llm:\n  base_url: {fake_llm.base_url}\n  model: fake\n  retries: 1\n"
        # Generous: the second, healthy turn must answer within the read timeout even on a
        # busy machine (0.3 s failed there); the hanging turns still time out (30 s sleeps).
        "  retry_backoff: 0.01\n  read_timeout: 3\n  connect_timeout: 2\n",
        encoding="utf-8",
    )
    transport = FakeTransport()
    app = await build(load_config(cfg, env={}), env={}, transports=[transport])
    await app.start()
    h = Harness(app, transport, fake_llm)
    try:
        fake_llm.script = [("sleep", 30), ("sleep", 30)]  # far beyond the read timeout
        await h.say("are you awake?")
        unavailable = unavailable_notice(fake_llm.base_url)
        assert [(r.kind, r.text) for r in transport.sent] == [(ReplyKind.NOTICE, unavailable)]
        assert len(fake_llm.chat_requests()) == 2  # the first try and one bounded retry
        rows = await h.store._all("SELECT role, text, status FROM messages ORDER BY id")
        assert [tuple(r) for r in rows] == [("user", "are you awake?", "failed")]
        fake_llm.reply = "yes, now"
        await h.say("hello again")
        assert transport.texts()[-1] == "yes, now"
        prompt = " ".join(m["content"] for m in fake_llm.chat_requests()[-1]["messages"])
        assert "are you awake?" in prompt and unavailable not in prompt
    finally:
        await app.close()
