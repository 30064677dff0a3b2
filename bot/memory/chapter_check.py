"""Is a model-written chapter about the conversation? If not, an extractive digest replaces it.

A small model asked to summarize often answers with the instruction itself ("You summarize
one stretch of a chat..."), the prompt's own scaffolding ("Earlier chapter (context only):
..."), or words that are not in the turns at all. Stored, such a chapter is sent with every
later reply and shown by ``!summary``. ``vet`` keeps a chapter only when it passes
``problem``; otherwise the fold stores ``digest``: the turns' most informative sentences,
verbatim, within the same budget.

Invariants:
- Pure functions of the texts (no model, no store): the same chapter and turns always get the
  same verdict, and a digest only ever quotes the turns (sentences whole, in their order,
  each with its speaker), so it can be wrong only by omission.
- A chapter is rejected when (1) it is empty of content words, (2) ``ECHO_SHARE`` of its
  word trigrams come from the instruction, (3) it carries the prompt's scaffolding, or (4)
  under ``MIN_GROUNDED`` of its content words occur (up to a plural or verb ending) in the
  turns it covers, or (5) its sentences are not grounded in them (``bot.memory.grounding``:
  a copy of the bot's answer, a name, number or place neither side said); a chapter that
  passes is stored as its grounded sentences only. A chapter that restates the earlier one
  is not rejected for that alone: it may be about the same things (a constant answer fails
  (4) at the next fold anyway).
- The digest prefers what the person said: their sentences first, the bot's where room is
  left (a small model's answers are long, and may be its own inventions).
- A digest fits ``limit`` tokens (``TokenCounter``); an empty one is never returned while
  the turns hold a word (the first sentence is cut to fit, marked with "…").
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence

from bot.llm.tokens import TokenCounter
from bot.memory import grounding
from bot.memory.grounding import STOP as _STOP
from bot.memory.grounding import Line, content_words, lines
from bot.memory.grounding import stem as _stem
from bot.memory.grounding import trigrams as _trigrams

log = logging.getLogger("bot.memory.chapters")

ECHO_SHARE = 0.3
MIN_GROUNDED = 0.2
TOKENS_PER_WORD = 1.4  # an English chapter's tokens per word, rounded up
DIGEST_MARK = "(quoted) "  # opens a digest: the reader sees it is the turns' own words
SMALL_TALK = "(small talk, nothing to keep)"  # the turns held no content word to quote
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
SCAFFOLD = ("earlier chapter (context only)", "new messages:", "(none yet)", "chapter 1:",
            "existing summary:", "new sessions:")  # fmt: skip
Sources = Sequence[tuple[str, str] | Line]
__all__ = ["content_words"]


def echoes(chapter: str, *, instructions: Sequence[str]) -> bool:
    """True when ``chapter`` is one of ``instructions`` echoed back, or the prompt's
    scaffolding: never shown as a summary (``!summary``), whenever it was stored."""
    grams = _trigrams(chapter)
    if not grams or any(s in chapter.lower() for s in SCAFFOLD):
        return bool(grams)
    return any(len(grams & _trigrams(i)) >= ECHO_SHARE * len(grams) for i in instructions)


def problem(
    chapter: str, *, instruction: str, sources: Sources, extra: Iterable[str] = ()
) -> str | None:
    """Why ``chapter`` must not be stored (a short reason for the log), or None if it may.
    ``sources`` are the lines it covers (``grounding.Line``, or (speaker, text) pairs);
    ``extra``: what else its input showed as said (the date lines)."""
    words = content_words(chapter)
    if not words:
        return "no content words"
    grams = _trigrams(chapter)
    if grams and len(grams & _trigrams(instruction)) >= ECHO_SHARE * len(grams):
        return "it echoes its instruction"
    low = chapter.lower()
    if any(s in low for s in SCAFFOLD):
        return "it repeats the prompt"
    said = {_stem(w) for line in lines(sources) for w in content_words(line.text)}
    said |= {_stem(w) for line in lines(sources) for w in content_words(line.speaker)}
    grounded = sum(_stem(w) in said for w in words)
    if grounded < MIN_GROUNDED * len(words):
        return f"only {grounded} of its {len(words)} content words are in the turns"
    why = grounding.problem(chapter, grounding.said(sources, extra=extra))
    return None if why is None else f"its sentences are not grounded ({why})"


def _ranked(sources: Sources) -> list[tuple[int, str, str]]:
    """The sentences of ``sources`` as (order, speaker, sentence), best first: the person's
    before the bot's (the person's own words are the ground truth; a small model's answers
    are long and may be invented), then by ``_informative``; "Hello!", "ok thanks" last."""
    sentences: list[tuple[int, str, str, bool]] = []  # (order, speaker, sentence, person)
    for who, text, person in lines(sources):
        for part in _SENTENCE.split(text.removeprefix(DIGEST_MARK)):  # (a merge of digests)
            part = " ".join(part.split())
            if content_words(part):
                sentences.append((len(sentences), who, part, person))
    score = _informative([s for _, _, s, _ in sentences])

    def key(item: tuple[int, str, str, bool]) -> tuple[bool, bool, float, int]:
        return len(content_words(item[2])) < 2, not item[3], -score(item[2]), item[0]

    return [(i, who, s) for i, who, s, _ in sorted(sentences, key=key)]


def _informative(sentences: Sequence[str]) -> Callable[[str], float]:
    """A sentence's score: rare words in this stretch weigh more; numbers and capitalised
    words (names, places, dates) twice."""
    freq: dict[str, int] = {}
    for s in sentences:
        for w in set(content_words(s)):
            freq[w] = freq.get(w, 0) + 1
    n = len(sentences)

    def score(sentence: str) -> float:
        raws = _WORD.findall(sentence)
        total = 0.0
        for i, raw in enumerate(raws):
            w = raw.lower()
            if w in _STOP or len(w) < 2 or w in raws[:i]:
                continue
            weight = math.log(1 + n / freq.get(w, 1))
            if raw[0].isdigit() or (i and raw[0].isupper()):  # a number, a name mid-sentence
                weight *= 2
            total += weight
        return total / math.sqrt(max(1, len(raws)))

    return score


def best_sentence(sources: Sources) -> str:
    """The sentence ``digest`` would quote first (the person's, if they said anything), or ""."""
    ranked = _ranked(sources)
    return ranked[0][2] if ranked else ""


def digest(sources: Sources, *, counter: TokenCounter, limit: int) -> str:
    """The most informative sentences of ``sources``, verbatim and in order, each after its
    speaker, within ``limit`` tokens: the person's lines first (``_ranked``), the bot's
    where room is left."""
    ranked = _ranked(sources)
    if not ranked:
        return ""
    # "Hello!", "ok thanks": quoted only when nothing says more
    saying = [i for i in ranked if len(content_words(i[2])) >= 2] or ranked
    budget = limit - counter.count(DIGEST_MARK)
    chosen: list[tuple[int, str, str]] = []
    used = 0
    for item in saying:
        cost = counter.count(f"{_said(item[1], item[2])} ")
        if used + cost <= budget:
            chosen.append(item)
            used += cost
    if not chosen:  # one sentence longer than the whole budget: cut it, visibly
        _, who, s = saying[0]
        words = s.split()
        while words and counter.count(_said(who, " ".join(words)) + " …") > budget:
            words = words[: max(0, len(words) - max(1, len(words) // 4))]
        return f"{DIGEST_MARK}{_said(who, ' '.join(words))} …" if words else ""
    chosen.sort(key=lambda i: i[0])
    return DIGEST_MARK + " ".join(_said(who, s) for _, who, s in chosen)


def _said(who: str, sentence: str) -> str:
    return f"{who}: {sentence}" if who else sentence


def words_limit(words: int, max_tokens: int) -> int:
    """A digest's token budget: what a chapter of ``words`` words costs, within
    ``max_tokens`` (so a digest never takes more of the prompt than a written chapter)."""
    return min(max_tokens, int(words * TOKENS_PER_WORD))


def vet(
    chapter: str,
    *,
    instruction: str,
    sources: Sources,
    counter: TokenCounter,
    limit: int,
    extra: Iterable[str] = (),
    what: str = "chapter",
) -> str:
    """``chapter``'s grounded sentences (``grounding.keep``) when it passes ``problem``, else
    a ``digest`` of ``sources`` (logged without any text, as every memory log line)."""
    why = problem(chapter, instruction=instruction, sources=sources, extra=extra)
    kept = None if why else grounding.keep(chapter, grounding.said(sources, extra=extra))
    if kept is not None:
        return kept
    log.warning("a model-written %s was rejected (%s); a digest of its %d turns is stored "
                "instead. Fix: a larger model writes text that passes",
                what, why or "no grounded sentence", len(sources))  # fmt: skip
    return digest(sources, counter=counter, limit=limit) or SMALL_TALK
