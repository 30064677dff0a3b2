"""Small pure text helpers shared by the responder and commands.

Invariant: ``fit_bytes`` never cuts inside a UTF-8 sequence and never returns more than
``limit`` bytes; ``small_number`` never raises (ASCII digits only); ``clean_inbound`` keeps
every printable character (emoji, RTL, CJK) and newlines/tabs, and removes NULs and other
control characters. ``fill_prompt`` replaces only
the placeholders ``{date}`` and ``{time}`` (UTC); any other brace text stays as written.
"""

from __future__ import annotations

import unicodedata
from datetime import datetime

ELLIPSIS = "…"
MESH_COMMAND_BYTES = 200  # every command reply fits one mesh packet


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``1 message``, ``2 messages``, ``1 summary``, ``0 summaries`` (``plural`` when adding
    an s is wrong)."""
    if n == 1:
        return f"1 {singular}"
    if plural is None:
        plural = singular[:-1] + "ies" if singular.endswith("y") else singular + "s"
    return f"{n} {plural}"


def small_number(text: str) -> int | None:
    """A small positive number written in ASCII digits, else None (never raises)."""
    text = text.strip()
    if not text or len(text) > 6 or not all("0" <= c <= "9" for c in text):
        return None
    return int(text)


def fit_bytes(text: str, limit: int = MESH_COMMAND_BYTES) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    room = limit - len(ELLIPSIS.encode("utf-8"))
    cut = raw[:room].decode("utf-8", "ignore")
    # Do not leave a combining mark or joiner dangling at the cut.
    while cut and unicodedata.category(cut[-1]) in ("Mn", "Me", "Cf", "Sk"):
        cut = cut[:-1]
    return cut.rstrip() + ELLIPSIS


def clean_inbound(text: str) -> str:
    out = []
    for ch in text:
        if ch in "\n\t":
            out.append(ch)
        elif ch == "\r" or unicodedata.category(ch) == "Cc":
            continue
        elif ch in ("\ufffe", "\uffff") or unicodedata.category(ch) == "Cs":
            continue  # lone surrogates from bad decoding cannot be stored as UTF-8
        else:
            out.append(ch)
    return "".join(out).strip()


def fill_prompt(prompt: str, now: datetime) -> str:
    """The system prompt with ``{date}`` (2026-11-23, Monday) and ``{time}`` (15:04 UTC)."""
    return prompt.replace("{date}", now.strftime("%Y-%m-%d, %A")).replace(
        "{time}", now.strftime("%H:%M UTC")
    )
