"""PostgreSQL's words are FTS5's words: ``words.fold`` (fold + ``porter.stem``, the port of FTS5's
porter stemmer) against the real FTS5 tokenizer of the SQLite schema, token for token, and
PostgreSQL's ``meshsage`` configuration keeping every one of them as it is.

The vocabulary: every word of the LoCoMo conversations bench/recall replays (read from
../shared/bench at test time, never copied here), and generated words that reach every rule of
every step (stems of one to many measures, y after vowels and consonants, doubled consonants,
non-ASCII letters, lengths around the 3- and 64-byte limits).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from bot.memory import schema as sqlite_schema

TOKENIZER = "porter unicode61 remove_diacritics 2"
LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "bench" / "locomo-dev.json"

asyncpg = pytest.importorskip(
    "asyncpg", reason="the PostgreSQL word modules live in meshsage[postgres]"
)
from bot.memory.postgres import porter  # noqa: E402
from bot.memory.postgres.words import fold  # noqa: E402

_PREFIXES = (
    "", "a", "b", "y", "by", "ay", "oy", "sy", "tr", "ab", "ee", "st", "rel", "cri", "try",
    "wax", "sky", "fizz", "hiss", "bomb", "trekk", "agr", "feed", "bl", "hop", "fil", "conv",
    "generalit", "oat", "yay", "rhythm", "queue", "über", "café", "шу", "naïve", "x" * 60,
)  # fmt: skip
_TAILS = ("", "s", "ed", "ing", "ly", "ness", "es", "ies", "e", "y", "al", "er")


def _generated() -> list[str]:
    suffixes = {"s", "es", "sses", "ies", "ss", "ed", "ing", "eed", "y", "e", "ll", "at", "bl"}
    for rules in (porter._STEP1B, porter._STEP2, porter._STEP3, porter._STEP4):
        for suffix, _, output in rules:
            suffixes |= {suffix.decode(), output.decode()}
    return [p + s + t for p in _PREFIXES for s in sorted(suffixes) for t in _TAILS if p + s + t]


def _fts5_tokens(words: list[str]) -> dict[int, list[str]]:
    """Each word's tokens as the SQLite store's FTS5 tokenizer emits them (via fts5vocab)."""
    con = sqlite3.connect(":memory:")
    try:
        con.execute(f"CREATE VIRTUAL TABLE t USING fts5(x, tokenize='{TOKENIZER}')")
        con.executemany("INSERT INTO t (rowid, x) VALUES (?, ?)", enumerate(words, 1))
        con.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
        out: dict[int, list[str]] = {}
        for term, doc in con.execute("SELECT term, doc FROM v ORDER BY doc, offset"):
            out.setdefault(doc, []).append(term)
        return out
    finally:
        con.close()


def _disagreements(words: list[str]) -> list[tuple[str, list[str], list[str]]]:
    want = _fts5_tokens(words)
    return [(w, want.get(i, []), fold(w).split()) for i, w in enumerate(words, 1)
            if want.get(i, []) != fold(w).split()]  # fmt: skip


def _locomo_words() -> list[str]:
    if not LOCOMO.exists():
        pytest.skip(f"{LOCOMO} is not here (the shared benchmark data)")
    return sorted(set(re.findall(r"\w+", json.dumps(json.loads(LOCOMO.read_text())).lower())))


def test_the_sqlite_store_uses_this_tokenizer() -> None:
    """What the comparison runs against is what the SQLite store indexes with."""
    sql = " ".join(m[1]() for m in sqlite_schema.MIGRATIONS)
    assert f"tokenize='{TOKENIZER}'" in sql


def test_generated_words_reaching_every_rule_stem_as_fts5_stems_them() -> None:
    words = sorted(set(_generated()))
    assert len(words) > 5000
    assert _disagreements(words) == []


def test_every_locomo_word_stems_as_fts5_stems_it() -> None:
    words = _locomo_words()
    assert len(words) > 5000
    assert _disagreements(words) == []


@pytest.mark.parametrize(
    ("word", "stemmed"),
    [("us", "us"), ("used", "us"), ("using", "us"), ("use", "us"), ("trekked", "trek"),
     ("hopping", "hop"), ("filing", "file"), ("generalizations", "gener"), ("sky", "sky"),
     ("happy", "happi"), ("x" * 65 + "ing", "x" * 65 + "ing")],
)  # fmt: skip
def test_known_stems(word: str, stemmed: str) -> None:
    """The words where PostgreSQL's Snowball porter disagreed (us, use, used, using, trek)."""
    assert porter.stem(word) == stemmed
    assert _fts5_tokens([word]) == {1: [stemmed]}


async def test_postgresql_keeps_every_python_word_as_it_is() -> None:
    """The ``meshsage`` configuration splits folded text into exactly its words and stems
    nothing more (012_fts5_porter_stems): what PostgreSQL stores is what FTS5 stores.

    One known exception, PostgreSQL's parser: a word that starts like a number in scientific
    notation ("9683e023fc", hex hashes) is split after the number ("9683e023", "fc"). A search
    for it is then a two-word phrase: it finds the same messages, plus any with those two parts
    as separate words in that order (docs/postgresql.md)."""
    from tests import pg_server

    words = sorted(set(_generated()) | (set(_locomo_words()) if LOCOMO.exists() else set()))
    words.append("9683e023fc")
    text = " ".join(fold(w) for w in words)
    store = await pg_server.open_store()
    try:
        stored = await store._val("SELECT tsvector_to_array(to_tsvector('meshsage', $1))", (text,))
        query = await store._val(
            "SELECT phraseto_tsquery('meshsage', $1)::text", (fold("us used"),)
        )
        split = await store._val(
            "SELECT phraseto_tsquery('meshsage', $1)::text", (fold("9683e023fc"),)
        )
    finally:
        await store.close()
    sci = re.compile(r"^([0-9]+e[0-9]+)(.+)$")
    want: set[str] = set()
    for word in text.split():
        m = sci.match(word)
        want |= set(m.groups()) if m and not m.group(2).isdigit() else {word}
    assert set(stored) == want
    assert query == "'us' <-> 'us'"
    assert split == "'9683e023' <-> 'fc'"


async def test_an_existing_database_is_restemmed_at_upgrade() -> None:
    """A database written before 012_fts5_porter_stems holds Snowball's words ("us" as "u",
    "used" as "us"): opening it rewrites every message's words and the word table, so search
    then finds what SQLite finds."""
    from bot.memory.postgres import PostgresStore
    from bot.memory.postgres.schema import MIGRATIONS, migrate
    from tests import pg_server

    server = pg_server.shared()
    name = server.new_database()
    url = server.url(name)
    con = await asyncpg.connect(url, password=pg_server.BOT_PASSWORD)
    try:
        await migrate(con, [m for m in MIGRATIONS if m[0] < "012"])
        await con.execute(
            "INSERT INTO conversations (transport, person, space, created_at) "
            "VALUES ('mesh', 'a', 'dm', 0), ('mesh', 'b', 'dm', 0)"
        )
        await con.execute(  # as add_message wrote them then: folded text, stemmed by Snowball
            "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens, "
            "status, search) SELECT c, 'user', 'x', t, 0, 1, 'sent', meshsage_keyed(c, "
            "to_tsvector('meshsage', lower(t)) || to_tsvector('meshsage', 'x 1 january 1970')) "
            "FROM (VALUES (1, 'we used it'), (1, 'tell us more'), (2, 'they trekked far'), "
            "(2, 'a trek')) v(c, t)"
        )
        assert (
            await con.fetchval(  # Snowball's words, before
                "SELECT count(*) FROM message_words WHERE word IN ('u', 'trekk')"
            )
            == 2
        )
    finally:
        await con.close()
    store = await PostgresStore.open(url, password=pg_server.BOT_PASSWORD)
    try:
        assert await store.search_terms(1, ["us", "used"], after_id=0, before_id=10**9) == [
            [1, 2], [1, 2]]  # fmt: skip
        assert await store.search_terms(2, ["trek", "trekked", "january"], after_id=0,
                                        before_id=10**9) == [[3, 4], [3, 4], [3, 4]]  # fmt: skip
        words = await store._all("SELECT word FROM message_words ORDER BY word")
        assert "u" not in {w[0] for w in words} and "trekk" not in {w[0] for w in words}
        assert (
            await store._val(  # the row trigger is back on after the rewrite
                "SELECT tgenabled FROM pg_trigger WHERE tgname = 'messages_words_update'"
            )
            == b"O"
        )
    finally:
        await store.close()
        server.drop_database(name)
