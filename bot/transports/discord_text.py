"""Discord text fitting: splitting an answer into messages of at most 2,000 characters, and
stripping the bot's mention from inbound text, and making inbound markup readable. Pure
functions; no discord import.

Invariants:
- Every part ``split_message`` returns is non-empty and at most ``limit`` long, counted in
  UTF-16 code units (never fewer than Unicode code points, so it is safe whichever way Discord
  counts); discord.py does not check the limit, the API answers HTTP 400.
- Cuts prefer, in order: a blank line, a line break, a sentence end, a space; a hard cut happens
  only when none lies in the second half of the window, and never separates a combining mark,
  a variation selector or a zero-width joiner from the character before it.
- A ``` code fence open at a cut is closed at the end of that part and reopened, with its
  language tag, at the start of the next one; an unclosed fence is closed at the end.
- ``fit_text(text)`` is the canonical text of an answer: line endings normalised, outer blank
  space stripped, and, when it would need more than ``max_parts`` messages, cut at a boundary
  and ended with ``TRUNCATED``. ``fit_text`` is idempotent, and ``split_message(fit_text(t))``
  is exactly what the person receives: the same text, with only the whitespace at each cut
  dropped and the synthetic fence lines added. This is what the responder stores.
- ``readable`` turns every ``<@id>``, ``<@!id>``, ``<@&id>``, ``<#id>``, custom emoji and
  timestamp code into the name a person sees (``@Alice``, ``@moderators``, ``#general``,
  ``:party:``, an ISO date); ids it cannot name become ``@unknown-user`` etc., never a number.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

DISCORD_MAX_CHARS = 2000  # per message, for bots
FENCE = "```"
CLOSER = "\n" + FENCE
MAX_LANG = 24  # longer "language tags" are not reopened (they are text, and eat the budget)
TRUNCATED = "… (answer cut: too long for Discord)"
MIN_LIMIT = 128  # below this the fence bookkeeping could leave no room for text

_SENTENCE_END = re.compile(r"[.!?…][)\]\"'»”’]*\s+")
_GLUE = {"\u200d", "\ufe0e", "\ufe0f"}  # ZWJ and variation selectors bind to the previous char


def units(text: str) -> int:
    """Length in UTF-16 code units (astral characters such as most emoji count twice)."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def normalize(text: str) -> str:
    """Canonical line endings, no outer whitespace (Discord trims it anyway)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def _fence_toggle(line: str) -> str | None:
    """The fence opener ("```py") when ``line`` is a fence line, else None."""
    s = line.strip()
    if not s.startswith(FENCE):
        return None
    if len(s) > len(FENCE) and s.count(FENCE) >= 2:
        return None  # ```inline``` on one line opens nothing
    return s


def fence_after(text: str, fence: str | None) -> str | None:
    """The fence still open after ``text`` given the one open before it (None = closed)."""
    for line in text.split("\n"):
        opener = _fence_toggle(line)
        if opener is None:
            continue
        fence = opener if fence is None else None
    return fence


def _reopen(fence: str) -> str:
    lang = fence[len(FENCE) :].strip()
    if len(lang) > MAX_LANG or " " in lang:
        lang = ""
    return FENCE + lang + "\n"


def _prefix_within(text: str, budget: int) -> int:
    """Largest n such that ``units(text[:n]) <= budget``."""
    n = min(len(text), budget)
    while n > 0 and units(text[:n]) > budget:
        n -= 1 + (units(text[:n]) - budget) // 2
    return max(n, 0)


def _cut(rest: str, n: int) -> tuple[int, int]:
    """Where to end this part and where the next begins, within ``rest[:n]`` (n < len(rest))."""
    floor = n // 2
    window = rest[: n + 1]  # a break right after the window still ends a part cleanly
    para = window.rfind("\n\n")
    if para >= floor:
        return para, para + 2
    line = window.rfind("\n")
    if line >= floor:
        return line, line + 1
    sentence_end, sentence_ws = -1, 0
    for m in _SENTENCE_END.finditer(rest, 0, n + 1):
        sentence_end = m.end()
        sentence_ws = len(m.group()) - len(m.group().rstrip())
    if sentence_end - 1 >= floor:
        return sentence_end - sentence_ws, sentence_end
    space = window.rfind(" ")
    if space >= floor:
        return space, space + 1
    end = n
    while end > 1 and (unicodedata.combining(rest[end]) or rest[end] in _GLUE):
        end -= 1
    return end, end


def _split_spans(text: str, limit: int) -> list[tuple[str, int]]:
    """Parts of normalised ``text`` with the offset in ``text`` where each part's text ends."""
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}")
    parts: list[tuple[str, int]] = []
    pos = 0
    fence: str | None = None
    while pos < len(text):
        prefix = _reopen(fence) if fence is not None else ""
        rest = text[pos:]
        whole = prefix + rest + (CLOSER if fence_after(rest, fence) is not None else "")
        if units(whole) <= limit:
            if rest.strip():
                parts.append((whole, len(text)))
            break
        budget = limit - units(prefix) - len(CLOSER)
        end, nxt = _cut(rest, _prefix_within(rest, budget))
        chunk = rest[:end].rstrip()
        opened = fence_after(chunk, fence)
        last_nl = chunk.rfind("\n")
        if (
            opened is not None
            and last_nl > 0
            and _fence_toggle(chunk[last_nl + 1 :]) is not None
            and fence_after(chunk[:last_nl], fence) is None
        ):
            # The part would end on a bare opening fence: leave the fence for the next part.
            end = nxt = last_nl + 1
            chunk = rest[:last_nl].rstrip()
            opened = fence_after(chunk, fence)
        if chunk.strip():
            parts.append((prefix + chunk + (CLOSER if opened is not None else ""), pos + end))
        fence = opened
        pos += nxt
        while pos < len(text) and text[pos] == "\n":
            pos += 1
    return parts


def split_message(text: str, *, limit: int = DISCORD_MAX_CHARS) -> list[str]:
    """The messages that carry ``text``; [] when it is blank."""
    return [part for part, _ in _split_spans(normalize(text), limit)]


def fit_text(text: str, *, limit: int = DISCORD_MAX_CHARS, max_parts: int) -> str:
    """The canonical form of an answer that ``split_message`` sends in <= ``max_parts`` parts."""
    text = normalize(text)
    spans = _split_spans(text, limit)
    if len(spans) <= max_parts:
        return text
    # Cut where the parts would end if each had room left for the marker, so it fits.
    reserve = units("\n\n" + TRUNCATED) + len(CLOSER)
    cut = _split_spans(text, max(MIN_LIMIT, limit - reserve))[max_parts - 1][1]
    while cut > 0:
        head = text[:cut].rstrip()
        closer = CLOSER if fence_after(head, None) is not None else ""
        candidate = head + closer + "\n\n" + TRUNCATED
        if len(_split_spans(candidate, limit)) <= max_parts:
            return candidate
        # Rare: the marker pushed the last part over; back off to an earlier word boundary.
        back = cut - len(TRUNCATED) - len(CLOSER)
        boundary = max(text.rfind(" ", 0, back), text.rfind("\n", 0, back))
        cut = boundary if boundary > 0 else back
    return TRUNCATED


def strip_mentions(text: str, *, user_ids: Iterable[int], role_ids: Iterable[int] = ()) -> str:
    """``text`` without ``<@id>``/``<@!id>`` for the given users and ``<@&id>`` for the roles."""
    for uid in user_ids:
        text = text.replace(f"<@{uid}>", "").replace(f"<@!{uid}>", "")
    for rid in role_ids:
        text = text.replace(f"<@&{rid}>", "")
    return re.sub(r"[ \t]{2,}", " ", text).strip()


_MARKUP = re.compile(
    r"<@!?(?P<user>\d+)>|<@&(?P<role>\d+)>|<#(?P<channel>\d+)>"
    r"|<a?:(?P<emoji>\w{1,64}):\d+>|<t:(?P<ts>-?\d{1,13})(?::[tTdDfFR])?>"
)


def readable(
    text: str,
    *,
    users: Mapping[int, str],
    roles: Mapping[int, str],
    channels: Mapping[int, str],
) -> str:
    """``text`` with Discord's mention, emoji and timestamp codes replaced by names."""

    def name(match: re.Match[str]) -> str:
        if (uid := match["user"]) is not None:
            return "@" + users.get(int(uid), "unknown-user")
        if (rid := match["role"]) is not None:
            return "@" + roles.get(int(rid), "unknown-role")
        if (cid := match["channel"]) is not None:
            return "#" + channels.get(int(cid), "unknown-channel")
        if (emoji := match["emoji"]) is not None:
            return f":{emoji}:"
        try:
            when = datetime.fromtimestamp(int(match["ts"]), UTC)
        except (OverflowError, OSError, ValueError):
            return match[0]
        return when.strftime("%Y-%m-%d %H:%M UTC")

    return _MARKUP.sub(name, text)


NOTE_MAX_CHARS = 200


def note_line(note: str | None) -> str | None:
    """A degradation note as one line of Discord subtext (small grey text)."""
    if not note or not note.strip():
        return None
    text = " ".join(note.split())
    if len(text) > NOTE_MAX_CHARS:
        text = text[: NOTE_MAX_CHARS - 1] + "…"
    return f"-# {text}"


SPEAKER_NAME_MAX = 48  # a display name is at most 32 characters; leave room, cut the rest


def speaker(name: str, user_id: int) -> str:
    """Who speaks in a shared channel, as the model sees it: the display name people see and
    the stable Discord id (two "Alex"es stay two people; a renamed person stays one)."""
    clean = " ".join("".join(c if c.isprintable() else " " for c in name).split())
    return f"{clean[:SPEAKER_NAME_MAX] or 'someone'} (id {user_id})"
