"""Facts the person states plainly, kept without a model: "my door code is 4521".

A small model may extract no fact at all from a chat full of them, or invent some. What a
person states plainly about themselves in the first person is kept whatever the model does:
"my dog is called Biscuit, she is a beagle" becomes "Their dog is called Biscuit, she is a
beagle"; "I live in Lisbon", "They live in Lisbon"; "I'm allergic to penicillin", "They are
allergic to penicillin". ``bot.memory.facts.FactExtractor`` stores them as inferred facts
with the message as provenance (``!facts`` shows it, ``!forget`` deletes them).

Invariants:
- Pure functions of the text; deterministic. Only the person's own messages are read (never
  the bot's), only statements (a sentence ending in "?" is a question, never a fact), never
  a negated one ("I'm not allergic ...") nor a conditional one ("if my ...").
- A fact is the person's own words from the statement to the end of its sentence (at most
  ``MAX_CHARS``, cut at a word), turned to the third person ("my" -> "their", "I" ->
  "they"): it can hold nothing the person did not say. Its subject ("dog", "door code") is
  what ``bot.memory.fact_values`` reads, so a new value replaces the old one.
"""

from __future__ import annotations

import re

from bot.memory.grounding import STOP, content_words, cut_words, sentences

MAX_CHARS = 160
_MY = re.compile(
    r"\bmy\s+(?P<subject>[a-z][\w'-]*(?:\s+[a-z][\w'-]*){0,3}?)\s+"
    r"(?P<rest>(?:is|are|was|will be)\s+(?!not\b|n't\b).+)",
    re.IGNORECASE,
)
_VERBS = "live|work|play|study|teach|own|speak|moved|grew up|drive|volunteer|sing|paint"
_I_DO = re.compile(rf"\bI\s+(?P<verb>{_VERBS})\s+(?P<rest>.+)", re.IGNORECASE)
_STATES = (
    "allergic to|going to|travelling to|traveling to|flying to|moving to|staying at|"
    "staying in|married to|from|learning|vegetarian|vegan|diabetic"
)
_I_AM = re.compile(
    rf"\b(?P<who>I'm|I am|we're|we are|I’m)\s+(?P<state>{_STATES})\b(?P<rest>.*)", re.IGNORECASE
)
_CLAUSE = re.compile(r"[;!]\s+|\s+(?:but|and then|so)\s+|(?:,|\s+and)\s+(?=(?:I|my|we)\b)")
_TRAVEL = frozenset(("going to", "travelling to", "traveling to", "flying to", "moving to"))
_SPECIFIC = re.compile(r"\d|\s[A-Z]")
_NEGATED = re.compile(r"\b(?:not|never|n't|no longer)\b", re.IGNORECASE)
_CONDITIONAL = re.compile(r"\b(?:if|unless|whether|maybe|perhaps)\b", re.IGNORECASE)
_BARE_WORDS = "god gosh goodness bad pleasure guess point question"
_BARE_SUBJECTS = frozenset(_BARE_WORDS.split())
_THIRD = {"my": "their", "mine": "theirs", "i": "they", "i'm": "they are", "me": "them",
          "i've": "they have", "i'll": "they will", "myself": "themselves", "am": "are",
          "we": "they", "we're": "they are", "our": "their", "us": "them"}  # fmt: skip
_PERSON_WORD = re.compile(r"\b(?:" + "|".join(map(re.escape, _THIRD)) + r")\b", re.IGNORECASE)


def statements(text: str) -> list[str]:
    """The plain first-person facts ``text`` states, each as a third-person sentence."""
    out: list[str] = []
    for sentence in sentences(text):
        if sentence.rstrip().endswith("?"):
            continue
        for clause in _CLAUSE.split(sentence):
            fact = _statement(clause.strip().rstrip(".!"))
            if fact and fact not in out:
                out.append(fact)
    return out


def _statement(clause: str) -> str | None:
    if _CONDITIONAL.search(clause[:40]):
        return None
    my = _MY.search(clause)
    words = my.group("subject").lower().split() if my is not None else []
    if my is not None and not (set(words) & (_BARE_SUBJECTS | STOP)):
        lead = f"Their {my.group('subject')} "
        return _finish(lead, my.group("rest"))
    do = _I_DO.search(clause)
    if do is not None:
        return _finish(f"They {do.group('verb').lower()} ", do.group("rest"))
    am = _I_AM.search(clause)
    if am is None:
        return None
    state = am.group("state").lower()
    if state in _TRAVEL and not _SPECIFIC.search(am.group("rest")):
        return None  # "I'm going to bed": a plan worth keeping names a place or a day
    return _finish(f"They are {state} ", am.group("rest"))


def _finish(lead: str, rest: str) -> str | None:
    if _NEGATED.search(rest.split(",")[0]) or not content_words(rest):
        return None
    text = lead + _PERSON_WORD.sub(lambda m: _third(m.group(0)), rest.strip())
    return cut_words(text, MAX_CHARS).rstrip(" ,") + "."


def _third(word: str) -> str:
    return _THIRD[word.lower()]
