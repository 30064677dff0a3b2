"""A fact's subject and value, so a new value replaces an old one instead of sitting beside it.

"my door code is 7788 at the north gate" and "my door code is 4521" are about one subject
("door code"); "my wife is called Maria" and "The person's wife is called Anna" too ("wife").
``!remember`` and fact extraction (bot.memory.facts) use ``same_subject`` to turn such a pair
into an update, and ``change_line`` to tell the person what changed ("door code: 4521 ->
7788 at the north gate").

Invariants:
- Pure functions of the texts; no model involved (a tiny model cannot be trusted to say that
  two facts are about one thing).
- A subject is the words before the first copula ("is", "are", "was", "am", optionally
  "called"/"named"/"now", or ":"/"="), without possessive determiners ("my", "the person's",
  "their" ...), 1 to ``MAX_SUBJECT_WORDS`` words, and never a bare pronoun: "I am vegetarian"
  and "I am a nurse" have no subject, so neither replaces the other.
- Texts without a subject never match by subject (the near-duplicate check still applies).
"""

from __future__ import annotations

import re

MAX_SUBJECT_WORDS = 5
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_COPULA = re.compile(
    r"\s(?:is|are|was|were|am)(?:\s+(?:now|still|called|named))*\s|\s*[:=]\s",
    re.IGNORECASE,
)
_DETERMINER_WORDS = "my our their his her your the a an this that person persons user users s"
_DETERMINERS = frozenset(_DETERMINER_WORDS.split())
_PRONOUN_WORDS = "i you he she they we it this that there what who"
_PRONOUNS = frozenset(_PRONOUN_WORDS.split())


def split(text: str) -> tuple[str, str] | None:
    """(subject, value) of a fact's text, or None when it names no subject."""
    match = _COPULA.search(text)
    if match is None or match.start() == 0:
        return None
    head = text[: match.start()]
    words = [w for w in _WORD.findall(head.lower()) if w not in _DETERMINERS]
    if not words or len(words) > MAX_SUBJECT_WORDS or all(w in _PRONOUNS for w in words):
        return None
    value = text[match.end() :].strip().rstrip(".!").strip()
    if not value:
        return None
    return " ".join(words), value


def subject(text: str) -> str | None:
    parts = split(text)
    return None if parts is None else parts[0]


def same_subject(a: str, b: str) -> bool:
    sa = subject(a)
    return sa is not None and sa == subject(b)


def same_value(a: str, b: str) -> bool:
    pa, pb = split(a), split(b)
    if pa is None or pb is None:
        return False
    return _WORD.findall(pa[1].lower()) == _WORD.findall(pb[1].lower())


def change_line(old: str, new: str) -> str:
    """What changed, short: "door code: 4521 -> 7788 at the north gate" (the whole texts when
    they name no common subject)."""
    po, pn = split(old), split(new)
    if po is None or pn is None or po[0] != pn[0]:
        return f"{old} -> {new}"
    return f"{pn[0]}: {po[1]} -> {pn[1]}"
