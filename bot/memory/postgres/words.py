"""Words as SQLite's FTS5 ``unicode61 remove_diacritics 2`` tokenizer sees them, for PostgreSQL.

PostgreSQL's own parser recognises e-mail addresses, URLs, hyphenated compounds and decimal
numbers as single tokens; FTS5 splits all of them into plain runs of letters and digits. So
text is folded here, in Python: lower case, diacritics removed, every character that is not a
letter, a digit or private-use becomes a space; then each word is stemmed by ``porter.stem``,
a port of FTS5's own porter stemmer (PostgreSQL's Snowball ``porter`` differs on short words
and some doubled consonants). The result holds only such runs, which PostgreSQL's parser
passes through one token each, and the ``meshsage`` configuration keeps them as they are (the
``simple`` dictionary since 012_fts5_porter_stems): PostgreSQL stores exactly FTS5's words.

Invariants: pure functions; ``fold`` of a term and of a text containing it agree, so a term
matches exactly where FTS5 would match the quoted phrase; tests/test_porter.py compares
``fold`` with FTS5's tokens word for word.
"""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime

from bot.memory.postgres.porter import stem

MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


def fold(text: str) -> str:
    """The words of ``text`` as FTS5's ``porter unicode61 remove_diacritics 2`` indexes them
    (folded, then stemmed), joined by single spaces."""
    out: list[str] = []
    for ch in unicodedata.normalize("NFD", text.lower()):
        cat = unicodedata.category(ch)
        if cat[0] == "M":
            continue  # a combining mark: the diacritic of the letter before it
        out.append(ch if cat[0] in "LN" or cat == "Co" else " ")
    return " ".join(map(stem, "".join(out).split()))


def meta(author: str, created_at: float) -> str:
    """The indexed meta line (author and date), as SQLite's ``_meta_sql`` writes it."""
    day = datetime.fromtimestamp(created_at, UTC)
    return f"{author} {day.day} {MONTHS[day.month - 1]} {day.year}"
