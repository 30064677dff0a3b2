"""Is what a model wrote said in the turns it covers? Checked sentence by sentence.

A small model asked for a chapter, a session's title and summary or a fact often writes
things nobody said ("the Sydney Opera House", "Biscuzzle's Hotel", "a virtual reality
platform"), or copies one of the bot's own answers back. Stored, such text is sent with every
later reply as if it were memory. The person's and the bot's words are the ground truth
(DESIGN.md, "Trust: verify before believing"): ``keep`` returns the part of a text that is
grounded in them, or None when too little is (the caller's extractive fallback stands).

Invariants:
- Pure functions of the texts (no model, no store, no clock).
- A sentence is grounded when (1) it is not a copy of one of the bot's lines (``COPY_SHARE``
  of its word trigrams in one bot line), (2) every *specific* it holds, a number or a
  capitalised word past its first word, was said by either side (or is in ``extra``: the
  dates the input showed), and (3) at least ``SENTENCE_GROUNDED`` of its content words (up to
  a plural or verb ending; summary words such as "discussed" aside) were said.
- ``keep`` keeps a text only when at least ``KEEP_SHARE`` of its sentences are grounded, and
  then only those sentences, verbatim and in order: what is stored never holds a name, number
  or place that neither side said.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from bot.memory.records import USER, StoredMessage
from bot.memory.window import date_lines, group_turns

SENTENCE_GROUNDED = 0.5
KEEP_SHARE = 0.5
COPY_SHARE = 0.8
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_STOP_WORDS = """the a an and or but of to in on at for with from by is are was were be been am
i you he she it we they my your his her its our their me him them this that these those there
here what who when where how why which not no yes do does did have has had will would can could
should so as if then than too very just also about into over some any all more most much many
one ok okay oh well really"""
STOP = frozenset(_STOP_WORDS.split())
# What a summary says about a conversation rather than in it: never a reason to reject one.
_META_WORDS = """person persons people user users assistant bot chat conversation session
summary chapter discussed discuss discussing talked talk talking mentioned mention mentions said
say says asked ask asks told tell tells shared share shares wants want wanted likes like liked
plans plan planned thing things something topic topics also both while during each other
which whose their theirs"""
_META = frozenset(_META_WORDS.split())


class Line(NamedTuple):
    """One message a model's text covers: its speaker, its text, and whether the person (not
    the bot) said it. A plain ``(speaker, text)`` pair counts as the person's."""

    speaker: str
    text: str
    person: bool = True


def lines(sources: Iterable[tuple[str, str] | Line]) -> list[Line]:
    return [s if isinstance(s, Line) else Line(*s) for s in sources]


def content_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP and len(w) > 1]


def stem(word: str) -> str:
    """Plural and verb endings cut ("boats" and "boat", "lives" and "live"): enough to see
    that a paraphrase uses the turns' words (not a linguistic stemmer; both sides alike)."""
    for end in ("ing", "ed", "es", "s"):
        if len(word) > len(end) + 2 and word.endswith(end):
            word = word[: -len(end)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word  # "live", "lived"


def trigrams(text: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def stems(text: str) -> set[str]:
    return {stem(w) for w in content_words(text)}


def sentences(text: str) -> list[str]:
    return [s for s in (" ".join(p.split()) for p in _SENTENCE.split(text)) if s]


@dataclass(frozen=True, slots=True)
class Said:
    """What the turns said, as the checks need it: every word (stemmed, either side, the
    speakers' names and ``extra`` too) and the bot's lines' trigrams."""

    words: frozenset[str]
    bot_lines: tuple[frozenset[tuple[str, ...]], ...]


def said(sources: Iterable[tuple[str, str] | Line], *, extra: Iterable[str] = ()) -> Said:
    items = lines(sources)
    texts = [*(s.text for s in items), *(s.speaker for s in items), *extra]
    words = frozenset(stem(w) for t in texts for w in _WORD.findall(t.lower()))
    bots = tuple(frozenset(trigrams(s.text)) for s in items if not s.person)
    return Said(words=words, bot_lines=tuple(b for b in bots if b))


def invented(sentence: str, ground: Said) -> list[str]:
    """The specifics of ``sentence`` (numbers, capitalised words past its first word) that
    neither side said."""
    raws = _WORD.findall(sentence)
    out: list[str] = []
    for i, raw in enumerate(raws):
        low = raw.lower()
        specific = any(c.isdigit() for c in raw) or (i > 0 and raw[0].isupper())
        if not specific or low in STOP or low in _META or len(low) < 2:
            continue
        if stem(low) not in ground.words:
            out.append(raw)
    return out


def sentence_problem(sentence: str, ground: Said) -> str | None:
    """Why ``sentence`` is not grounded in the turns (a short reason for the log), or None."""
    grams = trigrams(sentence)
    if grams and any(len(grams & b) >= COPY_SHARE * len(grams) for b in ground.bot_lines):
        return "it copies the bot's answer"
    new = invented(sentence, ground)
    if new:
        return f"{len(new)} name(s) or number(s) neither side said"
    words = [w for w in content_words(sentence) if w not in _META]
    known = sum(stem(w) in ground.words for w in words)
    if words and known < SENTENCE_GROUNDED * len(words):
        return f"only {known} of its {len(words)} content words were said"
    return None


def keep(text: str, ground: Said) -> str | None:
    """The grounded sentences of ``text``, verbatim and in order, when at least
    ``KEEP_SHARE`` of its sentences are; else None."""
    parts = sentences(text)
    good = [s for s in parts if sentence_problem(s, ground) is None]
    if not good or len(good) < KEEP_SHARE * len(parts):
        return None
    return " ".join(good)


def problem(text: str, ground: Said) -> str | None:
    """Why ``keep`` would refuse ``text`` (the first bad sentence's reason), or None."""
    if keep(text, ground) is not None:
        return None
    reasons = [r for s in sentences(text) if (r := sentence_problem(s, ground))]
    return reasons[0] if reasons else "no sentence"


def cut_words(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, cut at a word boundary with "…" (never mid-word)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    head = head[:space] if space > 0 else head
    return head.rstrip(" ,;:-") + "…"


def lines_of(messages: Sequence[StoredMessage]) -> list[Line]:
    return [Line(m.author, m.text, m.role == USER) for m in messages]


def dates_of(messages: Sequence[StoredMessage]) -> list[str]:
    """The date lines a model's input of ``messages`` shows (``window.dated_transcript``)."""
    return list(date_lines(group_turns(messages)).values())


def said_in(messages: Sequence[StoredMessage]) -> Said:
    """What ``messages`` said, their date lines as the model's input showed them included."""
    return said(lines_of(messages), extra=dates_of(messages))
