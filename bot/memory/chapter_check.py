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
  turns it covers. A chapter that restates the earlier one is not rejected for that alone:
  it may be about the same things (a constant answer fails (4) at the next fold anyway).
- A digest fits ``limit`` tokens (``TokenCounter``); an empty one is never returned while
  the turns hold a word (the first sentence is cut to fit, marked with "…").
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence

from bot.llm.tokens import TokenCounter

log = logging.getLogger("bot.memory.chapters")

ECHO_SHARE = 0.3
MIN_GROUNDED = 0.2
TOKENS_PER_WORD = 1.4  # an English chapter's tokens per word, rounded up
DIGEST_MARK = "(quoted) "  # opens a digest: the reader sees it is the turns' own words
SMALL_TALK = "(small talk, nothing to keep)"  # the turns held no content word to quote
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_STOP_WORDS = """the a an and or but of to in on at for with from by is are was were be been am
i you he she it we they my your his her its our their me him them this that these those there
here what who when where how why which not no yes do does did have has had will would can could
should so as if then than too very just also about into over some any all more most much many
one ok okay oh well really"""
_STOP = frozenset(_STOP_WORDS.split())
SCAFFOLD = ("earlier chapter (context only)", "new messages:", "(none yet)", "chapter 1:")


def content_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1]


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def echoes(chapter: str, *, instructions: Sequence[str]) -> bool:
    """True when ``chapter`` is one of ``instructions`` echoed back, or the prompt's
    scaffolding: never shown as a summary (``!summary``), whenever it was stored."""
    grams = _trigrams(chapter)
    if not grams or any(s in chapter.lower() for s in SCAFFOLD):
        return bool(grams)
    return any(len(grams & _trigrams(i)) >= ECHO_SHARE * len(grams) for i in instructions)


def _stem(word: str) -> str:
    """Plural and verb endings cut ("boats" and "boat", "talked" and "talk"): enough to see
    that a paraphrase uses the turns' words (not a linguistic stemmer; both sides alike)."""
    for end in ("ing", "ed", "es", "s"):
        if len(word) > len(end) + 2 and word.endswith(end):
            return word[: -len(end)]
    return word


def problem(chapter: str, *, instruction: str, sources: Sequence[tuple[str, str]]) -> str | None:
    """Why ``chapter`` must not be stored (a short reason for the log), or None if it may.
    ``sources`` are the (speaker, text) pairs it covers."""
    words = content_words(chapter)
    if not words:
        return "no content words"
    grams = _trigrams(chapter)
    if grams and len(grams & _trigrams(instruction)) >= ECHO_SHARE * len(grams):
        return "it echoes its instruction"
    low = chapter.lower()
    if any(s in low for s in SCAFFOLD):
        return "it repeats the prompt"
    said = {_stem(w) for _, text in sources for w in content_words(text)}
    said |= {_stem(w) for who, _ in sources for w in content_words(who)}
    grounded = sum(_stem(w) in said for w in words)
    if grounded < MIN_GROUNDED * len(words):
        return f"only {grounded} of its {len(words)} content words are in the turns"
    return None


def digest(sources: Sequence[tuple[str, str]], *, counter: TokenCounter, limit: int) -> str:
    """The most informative sentences of ``sources``, verbatim and in order, each after its
    speaker, within ``limit`` tokens. Informative: rare words in this stretch weigh more;
    numbers and capitalised words (names, places, dates) twice."""
    sentences: list[tuple[int, str, str]] = []  # (order, speaker, sentence)
    for who, text in sources:
        for part in _SENTENCE.split(text):
            part = " ".join(part.split())
            if content_words(part):
                sentences.append((len(sentences), who, part))
    if not sentences:
        return ""
    freq: dict[str, int] = {}
    for _, _, s in sentences:
        for w in set(content_words(s)):
            freq[w] = freq.get(w, 0) + 1
    n = len(sentences)

    def score(item: tuple[int, str, str]) -> float:
        raws = _WORD.findall(item[2])
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

    # "Hello!", "ok thanks": quoted only when nothing says more
    saying = [i for i in sentences if len(content_words(i[2])) >= 2] or sentences

    budget = limit - counter.count(DIGEST_MARK)
    chosen: list[tuple[int, str, str]] = []
    used = 0
    for item in sorted(saying, key=lambda i: (-score(i), i[0])):
        cost = counter.count(f"{_said(item[1], item[2])} ")
        if used + cost <= budget:
            chosen.append(item)
            used += cost
    if not chosen:  # one sentence longer than the whole budget: cut it, visibly
        _, who, s = max(saying, key=score)
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
    sources: Sequence[tuple[str, str]],
    counter: TokenCounter,
    limit: int,
) -> str:
    """``chapter`` when it passes ``problem``, else a ``digest`` of ``sources`` (logged
    without any text, as every memory log line)."""
    why = problem(chapter, instruction=instruction, sources=sources)
    if why is None:
        return chapter
    log.warning("a model-written chapter was rejected (%s); a digest of its %d turns is "
                "stored instead. Fix: a larger model writes chapters that pass",
                why, len(sources))  # fmt: skip
    return digest(sources, counter=counter, limit=limit) or SMALL_TALK
