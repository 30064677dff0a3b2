"""Words as SQLite's FTS5 ``unicode61 remove_diacritics 2`` tokenizer sees them, for PostgreSQL.

PostgreSQL's own parser recognises e-mail addresses, URLs, hyphenated compounds and decimal
numbers as single tokens; FTS5 splits all of them into plain runs of letters and digits. So
text is folded here, in Python, before PostgreSQL stems it: lower case, diacritics removed,
every character that is not a letter, a digit or private-use becomes a space. The folded text
holds only such runs, which PostgreSQL's parser passes through one token each, and the
``meshsage`` configuration stems them with Porter's algorithm, as FTS5's ``porter`` does.

Invariants: pure functions; ``fold`` of a term and of a text containing it agree, so a term
matches exactly where FTS5 would match the quoted phrase.
"""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime

MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


def fold(text: str) -> str:
    out: list[str] = []
    for ch in unicodedata.normalize("NFD", text.lower()):
        cat = unicodedata.category(ch)
        if cat[0] == "M":
            continue  # a combining mark: the diacritic of the letter before it
        out.append(ch if cat[0] in "LN" or cat == "Co" else " ")
    return " ".join("".join(out).split())


def meta(author: str, created_at: float) -> str:
    """The indexed meta line (author and date), as SQLite's ``_meta_sql`` writes it."""
    day = datetime.fromtimestamp(created_at, UTC)
    return f"{author} {day.day} {MONTHS[day.month - 1]} {day.year}"
