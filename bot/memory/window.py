"""The window: turns since the last fold, where it folds, and how it is written out.

``bot.memory.context`` assembles the prompt; this module owns the part of it that must stay a
byte-identical prefix between two folds: grouping the log into turns, finding the fold points
(``fold_start``), and rendering the turns as chat messages with their recall notes and date
lines (``render``).

Date lines: a message of the person's on another day (UTC) than their message before it in
the window (and the window's first one) opens with the day, ``[8 May 2023]``, on its own
line, right before their words (after the turn's recall note, which carries its own
dated lines). A new message on a new day is dated the same way in the final message, so the
next prompt shows it byte for byte as it was sent. A model reading the window (a reply, a
chapter written as a continuation of that prompt) so knows when each part was said.

Invariants:
- A date line depends only on the message and the person's message before it in the window,
  so between two folds (the window only grows at its end) every rendered message stays
  byte-identical.
- ``fold_start``'s fold points depend only on the turns' costs from the base; turn costs
  count the date lines of its messages as seen from the base (the first one always), and the
  window's first turn, which always shows one, is paid for by a
  constant allowance (the costliest date line) held back from the window's cap by the
  context builder: so the cap and the fold points never depend on where the window starts.
- A history turn is never split; messages alternate strictly, user first (runs of one role
  are joined), as some chat templates require.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from bot.llm.port import ChatMessage, Role
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter
from bot.memory.retrieval import day_label
from bot.memory.store import ASSISTANT, USER, StoredMessage

FOLD_SHARE = 0.95  # a fold moves at least this share of the window's cap into a chapter

__all__ = [
    "FOLD_SHARE",
    "anchor",
    "date_cost",
    "date_lines",
    "dated_transcript",
    "day_line",
    "fold_start",
    "group_turns",
    "join_final",
    "last_day",
    "render",
    "turn_costs",
]


def day_line(created_at: float) -> str:
    """The date line of a day (UTC), as recalled turns are dated too: ``[8 May 2023]``."""
    return day_label(created_at)


def group_turns(messages: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
    """Chronological messages -> turns (user run + the assistant run answering it).

    Leading assistant messages with no user message before them are dropped (their question is
    outside the range), so every turn starts with the person speaking.
    """
    turns: list[list[StoredMessage]] = []
    for msg in messages:
        if msg.role == USER and (not turns or turns[-1][-1].role == ASSISTANT):
            turns.append([msg])
        elif turns:
            turns[-1].append(msg)
    return turns


def date_lines(turns: Sequence[Sequence[StoredMessage]]) -> dict[int, str]:
    """Id of each of the person's messages that opens with a date line -> the line: the first
    one, and each on another day than the person's message before it (an answer the next day
    dates nothing; a message after a day without answers does)."""
    out: dict[int, str] = {}
    last = ""
    for turn in turns:
        for msg in turn:
            if msg.role != USER:
                continue
            day = day_line(msg.created_at)
            if day != last:
                out[msg.id] = day
                last = day
    return out


def dated_transcript(messages: Sequence[StoredMessage]) -> str:
    """``author: text`` lines, each of the person's messages on a new day after its date line,
    as the window dates them: a summary's input (a chapter, a session) keeps when."""
    dates = date_lines(group_turns(messages))
    lines: list[str] = []
    for m in messages:
        if m.id in dates:
            lines.append(dates[m.id])
        lines.append(f"{m.author}: {m.text}")
    return "\n".join(lines)


def date_cost(message: StoredMessage, counter: TokenCounter) -> int:
    """Tokens of a message's date line (and its line break)."""
    return counter.count(day_line(message.created_at)) + 1


def last_day(turns: Sequence[Sequence[StoredMessage]]) -> str:
    """The date line of the person's last message in ``turns`` (a turn starts with one)."""
    said = [m for m in turns[-1] if m.role == USER]
    return day_line(said[-1].created_at)


def turn_costs(
    turns: Sequence[Sequence[StoredMessage]],
    notes: Mapping[int, str],
    *,
    counter: TokenCounter,
    measure: Callable[[str], int],
    named: bool = False,
) -> list[int]:
    """Each turn's tokens in the window: its messages, its recall note (``measure``d as the
    prompt joins it), its date lines (``date_lines`` as seen from the first turn) and,
    ``named``, its speakers."""
    dates = date_lines(turns)
    out: list[int] = []
    for turn in turns:
        own = sum(m.tokens + MESSAGE_OVERHEAD for m in turn)
        if named:
            own += sum(counter.count(m.author) + 2 for m in turn if m.role == USER)
        own += sum(measure(notes[m.id]) for m in turn if m.id in notes)
        own += sum(date_cost(m, counter) for m in turn if m.id in dates)
        out.append(own)
    return out


def fold_start(costs: Sequence[int], *, cap: int, min_turns: int = 1) -> int:
    """Index of the first turn of the window: the first fold point from which ``costs`` fit
    ``cap``. Fold points are found from the front in blocks of at least ``FOLD_SHARE * cap``;
    a block only counts once a turn follows it, and holds at least ``min_turns`` turns (the
    summarizer writes a chapter only for enough messages). So fold points never move when
    turns are appended (the window is stable between folds) and a fold always keeps the newest
    turn."""
    block = max(1, int(cap * FOLD_SHARE))
    start, total = 0, sum(costs)
    while total > cap:
        moved, end = 0, start
        while end < len(costs) and (moved < block or end - start < min_turns):
            moved += costs[end]
            end += 1
        if end >= len(costs):
            break  # the block is not complete yet
        start, total = end, total - moved
    return start


def squeeze_point(costs: Sequence[int], *, room: int, min_turns: int = 1) -> int | None:
    """Where a window of ``costs`` folds now because the next prompt leaves it only ``room``
    (less than its cap assumed: facts that arrived since the fold, a recall note, a long
    message): the end of the blocks of ``room``'s size (as ``fold_start`` cuts them, the
    whole window included) that must go, so their chapter is written before any turn has to
    leave the prompt uncovered. None when the window fits, or not even one block is there (a
    tiny budget: the oldest turns drop)."""
    if sum(costs) <= room:
        return None
    ahead = fold_start([*costs, room + 1], cap=max(1, room), min_turns=min_turns)
    return ahead or None


def anchor(msg: StoredMessage) -> int:
    """Sort key that puts each answer right after its question (a late answer keeps the
    window's order stable)."""
    return msg.parent_id if msg.role == ASSISTANT and msg.parent_id else msg.id


def render(
    window: Sequence[StoredMessage],
    *,
    notes: Mapping[int, str],
    dates: Mapping[int, str],
    named: bool = False,
) -> list[ChatMessage]:
    """The window as strictly alternating user/assistant messages, user first (some chat
    templates reject anything else): runs of one role are joined; a user message that carried
    a recall note is shown with it again, then its date line (``dates``), then its words."""
    out: list[tuple[Role, str]] = []
    for msg in window:
        role: Role = "user" if msg.role == USER else "assistant"
        text = f"{msg.author}: {msg.text}" if named and role == "user" else msg.text
        if role == "user" and msg.id in dates:
            text = f"{dates[msg.id]}\n{text}"
        if role == "user" and msg.id in notes:
            text = f"{notes[msg.id]}\n\n{text}"
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + "\n\n" + text)
        else:
            out.append((role, text))
    return [ChatMessage(role, text) for role, text in out]


def join_final(window: list[ChatMessage], final: str) -> list[ChatMessage]:
    """Append the final user message (joined to a trailing user run: strict alternation)."""
    if window and window[-1].role == "user":
        return [*window[:-1], ChatMessage("user", window[-1].content + "\n\n" + final)]
    return [*window, ChatMessage("user", final)]
