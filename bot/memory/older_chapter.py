"""The older session's summary that best matches a message: shown once in the prompt's tail.

Rule 7 of docs/memory.md "Recall that answers": budget still free after recall takes the
summary of one older session that shares at least ``CHAPTER_OVERLAP`` of the message's content
words, the newer on a tie.

Invariants:
- Only sessions that ended before the window (``before``) and began after the conversation's
  reset mark are considered, among the newest ``CHAPTER_SESSIONS`` (the caller reads them).
- Pure: the same sessions and message give the same text (a restart sends the same prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.memory.records import Session
from bot.memory.retrieval import day_label, query_terms
from bot.memory.store import Conversation

CHAPTER_HEADER = "(Summary of an earlier session that may be relevant,"
NOTE_END = ")"
CHAPTER_SESSIONS = 64  # newest summarized sessions a chapter for the tail is chosen among
CHAPTER_OVERLAP = 0.5  # share of the message's content words an older chapter must hold


def older_chapter(
    conversation: Conversation, sessions: Sequence[Session], text: str, *, before: int
) -> str:
    """The summary of the older session (ended before ``before``, after the reset mark;
    among ``sessions``) sharing the most of the message's content words, at least
    ``CHAPTER_OVERLAP`` of them (the newer on a tie), rendered; "" if none."""
    terms = set(query_terms(text))
    if not terms:
        return ""
    best, best_share = None, 0.0
    for session in sessions:
        if not session.summary or session.last_message_id >= before:
            continue
        if session.first_message_id <= conversation.reset_after:
            continue
        words = set(query_terms(f"{session.title or ''} {session.summary}", limit=None))
        share = len(terms & words) / len(terms)
        if share >= CHAPTER_OVERLAP and share >= best_share:
            best, best_share = session, share
    if best is None:
        return ""
    title = f"{best.title}: " if best.title else ""
    day = day_label(best.started_at)
    return f"{CHAPTER_HEADER} {day}\n{title}{best.summary}{NOTE_END}"
