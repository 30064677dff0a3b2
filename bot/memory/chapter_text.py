"""What a chapter is made of: the prompts that ask for one and the pure functions that build
their input (``bot.memory.summary`` schedules and writes chapters with them).

Invariants:
- The prompts ask first for what people ask about later (names, dates, places, numbers and
  decisions, verbatim, with who said them); whatever varies between two requests for the same
  chapter (the word limit, ``LIMIT_LINE``) is the last line, so a retry re-reads only that.
- ``bounded`` takes a front part of the messages that ends on a turn boundary (the next
  window starts with the person speaking) and holds at least one message.
- A chapter's input carries its messages' dates as the reply's window shows them
  (``bot.memory.window.dated_transcript``).
- Nothing here reads the store, the clock or the network.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from bot.llm.tokens import TokenCounter
from bot.memory import chapter_check, grounding
from bot.memory.records import USER, StoredMessage, Summary
from bot.memory.window import dated_transcript

# What people ask about later is concrete: who, when, where, how many, what was decided. The
# prompts ask for those first and verbatim (a paraphrased date or number cannot be recalled).
CHAPTER_PROMPT = (
    "You summarize one stretch of a chat between a person and an assistant, as a chapter "
    "that follows the earlier ones. First keep every name, date, time, place, number and "
    "decision exactly as written, with who said or did it; then preferences and open "
    "questions. Drop small talk and anything the earlier chapters already say. Write plain "
    "sentences, no preamble."
)
MERGE_PROMPT = (
    "Merge these consecutive summary chapters of one chat into a single summary. Keep every "
    "name, date, time, place, number and decision exactly as written, with who said or did "
    "it; then preferences and open questions. Drop only what later chapters superseded. "
    "Write plain sentences, no preamble."
)
# The task message a continuation fold ends with (after the reply's prompt and answer).
CONTINUATION_MARK = "(Not a message to answer: a summary task.)"
CONTINUATION_PROMPT = (
    CONTINUATION_MARK + ' Summarize the chat above up to my message "{until}" (not '
    "included) as a chapter: names, dates, places, numbers and decisions exactly as written, "
    "who said them; then open questions. Plain sentences."
)
LIMIT_LINE = "(At most {words} words.)"  # always last: a retry "shorter" changes only this
MAX_FOLD_MESSAGES = 60
FOLD_INPUT_TOKENS = 1500
LINE_TOKENS = 4  # an author and separators per message line
_SENTENCE_END = re.compile(r"[.!?。！？](?=\s|$)")


def bounded(
    pending: list[StoredMessage], counter: TokenCounter, *, limit: int = FOLD_INPUT_TOKENS
) -> list[StoredMessage]:
    """A front part of ``pending`` within the input bounds (``limit`` tokens, each line with
    its author) that ends on a turn boundary; at least one message."""
    used, n = 0, 0
    for msg in pending[:MAX_FOLD_MESSAGES]:
        cost = msg.tokens + LINE_TOKENS
        if n and used + cost > limit:
            break
        used += cost
        n += 1
    while 1 < n < len(pending) and pending[n].role != USER:
        n -= 1  # the next window must start with the person speaking
    return pending[:n]


def last_sentence(text: str) -> str:
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    return text[: ends[-1]] if ends else text


def own_lines(messages: Sequence[StoredMessage], words: int, counter: TokenCounter) -> str:
    """A chapter with no model text: the digest of the block (``chapter_check.digest``, the
    person's most informative sentences first, verbatim) within what ``words`` words cost."""
    limit = int(words * chapter_check.TOKENS_PER_WORD)
    return chapter_check.digest(grounding.lines_of(messages), counter=counter, limit=limit)


def fold_input(before: str, messages: Sequence[StoredMessage]) -> str:
    """A standalone chapter's input: the messages dated as the reply's window shows them (a
    date line where a turn's day changes, ``bot.memory.window``), so a chapter keeps when."""
    lines = [f"Earlier chapter (context only): {before or '(none yet)'}", "", "New messages:"]
    return "\n".join(lines) + "\n" + dated_transcript(messages)


def merge_input(chapters: Sequence[Summary]) -> str:
    return "\n\n".join(f"Chapter {i}: {c.text}" for i, c in enumerate(chapters, 1))
