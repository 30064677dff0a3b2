"""Scoring for ``bench.memory_e2e``: what a reply request holds of a question's evidence.

- recall: the share of the evidence turns whose text is in the prompt (verbatim);
- dated (temporal questions): whether the day of every evidence turn is written in the prompt,
  in one of the forms the bot writes dates or a model writes them from those;
- evidence words: the share of the evidence turns' concrete words (names, numbers, months;
  ``bench.summary_facts.facts``) in the prompt, whoever wrote them there: a verbatim turn, a
  chapter, a session or long-term summary, a fact. Meant for a real model writing the memory;
  the fake's word-list summaries hold names too, so compare it within one model.
Nothing here reads a clock or the network.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from bench.prefix import CONTEXT_TOKENS
from bench.recall import DAY, Dialogue, Question, Turn
from bench.summary_facts import _TOKEN
from bench.summary_facts import facts as concrete_words
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter
from bot.memory.chapter_check import DIGEST_MARK
from bot.memory.store import StoredMessage
from bot.memory.window import date_lines, group_turns

TEMPORAL = 2  # LoCoMo's category for "when" questions


@dataclass
class Tally:
    recall: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    unanswered: list[str] = field(default_factory=list)  # questions with no reply request
    dated: list[float] = field(default_factory=list)  # temporal: every evidence day shown
    words: list[float] = field(default_factory=list)  # evidence names/dates/numbers shown
    chapter: int = 0  # prompts with an older session's summary (rule 7)
    longterm: int = 0  # prompts with the long-term summary

    def add(self, category: int, score: float, tokens: int) -> None:
        self.recall[category].append(score)
        self.tokens.append(tokens)

    def miss(self, category: int, why: str) -> None:
        """A question the bot sent no reply request for: nothing reached the model (0)."""
        self.recall[category].append(0.0)
        self.unanswered.append(why)
        if category == TEMPORAL:
            self.dated.append(0.0)


@dataclass
class Kept:
    """What the memory held at the end of a replay (summed over conversations)."""

    sessions: int = 0
    summarized: int = 0
    chapters: int = 0
    facts: int = 0
    longterm: int = 0  # conversations with a long-term summary
    conversations: int = 0


def score(question: Question, body: dict[str, Any], text_of: dict[str, str]) -> float:
    sent = "\n".join(str(m["content"]) for m in body["messages"])
    return sum(text_of[e] in sent for e in question.evidence) / len(question.evidence)


def day_forms(created_at: float) -> tuple[str, ...]:
    """How a day may be written in a prompt: the bot's date lines ("8 May 2023"), ISO (the
    long-term summary's input), and the forms a model writes from them."""
    d = datetime.fromtimestamp(created_at, UTC)
    return (
        f"{d.day} {d:%b %Y}",
        f"{d.day} {d:%B %Y}",
        f"{d.day} {d:%B}, {d:%Y}",
        f"{d:%B} {d.day}, {d:%Y}",
        f"{d:%Y-%m-%d}",
    )


def dated(question: Question, body: dict[str, Any], time_of: dict[str, float]) -> float:
    """1.0 when the day of every evidence turn is written somewhere in the prompt."""
    sent = "\n".join(str(m["content"]) for m in body["messages"])
    days = {int(time_of[e] // DAY): time_of[e] for e in question.evidence}
    return float(all(any(f in sent for f in day_forms(t)) for t in days.values()))


def words_shown(question: Question, body: dict[str, Any], text_of: dict[str, str]) -> float | None:
    """Share of the evidence turns' concrete words (names, numbers, months: the words a
    question's answer is made of) present in the prompt, whoever wrote them there (a verbatim
    turn, a chapter, a fact). None when the evidence has no such word."""
    wanted: set[str] = set()
    for e in question.evidence:
        wanted |= concrete_words(text_of[e])
    if not wanted:
        return None
    sent = {
        w.lower().rstrip(".,") for m in body["messages"] for w in _TOKEN.findall(str(m["content"]))
    }
    return len(wanted & sent) / len(wanted)


def sent_tokens(body: dict[str, Any], counter: TokenCounter) -> int:
    """The request's size as the bot counts it against its budget (content + overheads)."""
    return sum(counter.count(str(m["content"])) + MESSAGE_OVERHEAD for m in body["messages"])


def session_of(turn: Turn) -> int:
    return int(turn.dia_id[1:].split(":")[0])  # "D3:12" -> 3


def first_sessions(dlg: Dialogue, sessions: int | None) -> Dialogue:
    """Only the first ``sessions`` sessions of ``dlg`` and the questions whose evidence lies
    in them (a real model writing the memory is slow: a run sized to the time there is)."""
    if sessions is None:
        return dlg
    turns = [t for t in dlg.turns if session_of(t) <= sessions]
    ids = {t.dia_id for t in turns}
    questions = [q for q in dlg.questions if set(q.evidence) <= ids]
    return replace(dlg, turns=turns, questions=questions)


def pick(questions: Sequence[Question], categories: set[int], limit: int | None) -> list[Question]:
    chosen = [q for q in questions if q.category in categories]
    if limit is None or limit >= len(chosen):
        return chosen
    step = len(chosen) / limit
    return [chosen[int(i * step)] for i in range(limit)]


def _mean(values: Sequence[float]) -> str:
    return f"{statistics.mean(values):.3f}" if values else "-"


def table(tallies: dict[str, Tally], categories: Sequence[int]) -> str:
    head = " | ".join(f"cat {c}" for c in categories)
    lines = [
        f"| variant | questions | {head} | all asked | temporal dated | evidence words "
        f"| older chapter | long-term | prompt tokens mean (of {CONTEXT_TOKENS}) "
        "| min | max | no reply request | seconds |",
        "|---|---:|" + "---:|" * len(categories) + "---:|" * 11,
    ]
    for name, t in tallies.items():
        every = [s for c in categories for s in t.recall.get(c, [])]
        if not every:
            continue
        cells = " | ".join(
            f"{statistics.mean(t.recall[c]):.3f} ({len(t.recall[c])})" if t.recall.get(c) else "-"
            for c in categories
        )
        asked = len(t.tokens)
        lines.append(
            f"| {name} | {len(every)} | {cells} | **{statistics.mean(every):.3f}** "
            f"| {_mean(t.dated)} ({len(t.dated)}) | {_mean(t.words)} "
            f"| {t.chapter}/{asked} | {t.longterm}/{asked} "
            f"| {statistics.mean(t.tokens or [0]):.0f} | {min(t.tokens, default=0)} "
            f"| {max(t.tokens, default=0)} "
            f"| {len(t.unanswered)} | {t.seconds:.0f} |"
        )
    return "\n".join(lines)


def kept_line(k: Kept) -> str:
    n = max(k.conversations, 1)
    return (
        f"memory at the end (per conversation): {k.sessions / n:.1f} sessions, "
        f"{k.summarized / n:.1f} summarized, {k.chapters / n:.1f} chapters, "
        f"{k.facts / n:.1f} facts; long-term summary in {k.longterm} of {k.conversations}"
    )


_SPECIFIC = re.compile(r"[^\W_]+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def invented(text: str, said: set[str]) -> list[str]:
    """Numbers and capitalised words past a sentence's first word in ``text`` that are not
    among the words ``said`` (lower case)."""
    out: list[str] = []
    for sentence in _SENTENCE.split(text.removeprefix(DIGEST_MARK)):
        for i, raw in enumerate(_SPECIFIC.findall(sentence)):
            specific = any(c.isdigit() for c in raw) or (i > 0 and raw[0].isupper())
            if specific and raw.lower() not in said and raw != "I":
                out.append(raw)
    return out


def said_words(messages: Sequence[StoredMessage]) -> set[str]:
    texts = [m.text for m in messages] + [m.author for m in messages]
    texts += list(date_lines(group_turns(messages)).values())
    return {w.lower() for t in texts for w in _SPECIFIC.findall(t)}
