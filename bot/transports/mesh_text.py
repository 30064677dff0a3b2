"""Fitting text to Meshtastic packets: pure functions, no meshtastic import.

A mesh text packet carries at most ``DATA_PAYLOAD_LEN`` (233) UTF-8 bytes and the official apps
cap messages at 200, so an answer goes out as numbered parts of at most ``chunk_bytes`` bytes.

Invariants (checked by property tests):
- ``normalize`` is idempotent: stripped, CR/LF unified, every whitespace run collapsed to one
  character (``"\\n"`` when the run held a line break, else ``" "``).
- ``split_parts(text)`` partitions ``normalize(text)``: joining every part's ``body + sep`` gives
  it back exactly. A part is cut at a sentence end, else at a space, else between grapheme
  clusters; never inside a UTF-8 sequence or a grapheme cluster (base + combining marks, ZWJ
  sequences, variation selectors, skin-tone modifiers, regional-indicator pairs, tags). Only a
  single cluster longer than a whole packet is cut between code points (where possible not
  before a combining mark or ZWJ).
- ``render_parts`` stays within ``chunk_bytes`` even for 10 or more parts (``split_parts``
  sizes the numbering to the real count).
- ``render_parts`` numbers parts ``(i/n) `` only when there is more than one; every rendered part
  is at most ``chunk_bytes`` UTF-8 bytes, numbering included.
- ``fit(text)`` is ``normalize(text)``, shortened at a sentence boundary (else a space, else a
  cluster boundary) with ``MARKER`` when it would need more than ``max_parts`` parts. It is a fixed
  point (``fit(fit(t)) == fit(t)``) and ``split_parts(fit(t))`` needs at most ``max_parts`` parts,
  so what the outbox holds is exactly what the radio sends. ``fit_more`` also returns the rest
  (for ``!more``).
- No wasted packets: a part ends at a space only in the second half of its window; otherwise
  the long word is cut at a cluster boundary.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

DATA_PAYLOAD_LEN = 233  # meshtastic mesh_pb2.Constants.DATA_PAYLOAD_LEN
DEFAULT_CHUNK_BYTES = 200  # what the official apps allow; leaves room for PKI and reply ids
MARKER = " …"  # appended where a reply was shortened
# Firmware drops a second text sent within 2 s; the margin covers clock jitter on the host.
MIN_PACKET_SPACING_SECONDS = 2.1
_SENTENCE_END = frozenset(".!?…。！？")
_CLOSERS = frozenset("\"')]}»”’」』）")
_CJK_FULL_STOPS = frozenset("。！？")
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def normalize(text: str) -> str:
    """Strip and collapse whitespace runs (keeping one line break where there was one)."""
    out: list[str] = []
    run: list[str] = []
    for ch in text.strip():
        if ch.isspace():
            run.append(ch)
            continue
        if run:
            out.append(
                "\n" if any(c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029" for c in run) else " "
            )
            run = []
        out.append(ch)
    return "".join(out)


# --- grapheme clusters (a conservative subset of UAX #29) ----------------------------------


def _is_extender(ch: str) -> bool:
    """Characters that attach to what precedes them (never start a part)."""
    cp = ord(ch)
    if unicodedata.category(ch) in ("Mn", "Me", "Mc"):
        return True
    return (
        cp in (0x200C, 0x200D, 0xFF9E, 0xFF9F)  # ZWNJ, ZWJ, halfwidth katakana voicing marks
        or 0xFE00 <= cp <= 0xFE0F  # variation selectors
        or 0xE0100 <= cp <= 0xE01EF
        or 0x1F3FB <= cp <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xE0020 <= cp <= 0xE007F  # tag characters (subdivision flags)
        or 0x1160 <= cp <= 0x11FF  # Hangul medial vowels and final consonants
        or 0xD7B0 <= cp <= 0xD7FF
    )


def _is_pictographic(ch: str) -> bool:
    """An approximation of Extended_Pictographic (emoji and pictographic symbols)."""
    cp = ord(ch)
    if 0x1F1E6 <= cp <= 0x1F1FF:  # regional indicators (flags) are not Extended_Pictographic
        return False
    return (
        0x1F000 <= cp <= 0x1FAFF
        or 0x2600 <= cp <= 0x27BF
        or 0x2300 <= cp <= 0x23FF
        or 0x2B00 <= cp <= 0x2BFF
        or 0x2190 <= cp <= 0x21FF
        or cp in (0xA9, 0xAE, 0x203C, 0x2049, 0x2122, 0x2139, 0x3030, 0x303D, 0x3297, 0x3299)
    )


def _zwj_joins(text: str, i: int) -> bool:
    """``text[i-1]`` is a ZWJ: it joins ``text[i]`` only between two pictographs (UAX #29
    GB11: pictograph, extenders, ZWJ x pictograph); "a" ZWJ "a" are two clusters."""
    if not _is_pictographic(text[i]):
        return False
    j = i - 2
    while j >= 0 and text[j] != "\u200d" and _is_extender(text[j]):
        j -= 1
    return j >= 0 and _is_pictographic(text[j])


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _is_hangul_lead(ch: str) -> bool:
    cp = ord(ch)
    return 0x1100 <= cp <= 0x115F or 0xA960 <= cp <= 0xA97F


def is_boundary(text: str, i: int) -> bool:
    """True when ``text`` may be cut before index ``i`` without breaking a grapheme cluster."""
    if i <= 0 or i >= len(text):
        return True
    prev, cur = text[i - 1], text[i]
    if _is_extender(cur) or (prev == "\u200d" and _zwj_joins(text, i)):
        return False
    if _is_hangul_lead(prev) and (_is_hangul_lead(cur) or 0xAC00 <= ord(cur) <= 0xD7A3):
        return False
    if _is_regional(prev) and _is_regional(cur):
        run = 0
        j = i - 1
        while j >= 0 and _is_regional(text[j]):
            run += 1
            j -= 1
        return run % 2 == 0  # an odd run before i means text[i] completes a flag
    return True


def graphemes(text: str) -> list[str]:
    """Split into clusters with the same rules as ``is_boundary`` (for tests and tools)."""
    out: list[str] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or is_boundary(text, i):
            out.append(text[start:i])
            start = i
    return out


# --- splitting ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Part:
    body: str  # what the part carries, without numbering
    sep: str  # the whitespace removed after it ("" for a cut between clusters or the last part)


def _prefix_len(max_parts: int) -> int:
    return utf8_len(f"({max_parts}/{max_parts}) ")


def _window(text: str, budget: int) -> int:
    """Largest index ``w`` with ``text[:w]`` within ``budget`` bytes (may split a cluster)."""
    used = 0
    for i, ch in enumerate(text):
        used += utf8_len(ch)
        if used > budget:
            return i
    return len(text)


def _is_sentence_cut(text: str, i: int) -> bool:
    """Whitespace at ``i`` that follows a sentence end (optionally closed by quotes/brackets)."""
    j = i - 1
    while j >= 0 and text[j] in _CLOSERS:
        j -= 1
    return j >= 0 and text[j] in _SENTENCE_END


def _cut(text: str, budget: int) -> tuple[int, int]:
    """Where to end the first part of ``text`` (longer than ``budget`` bytes).

    Returns ``(end, resume)``: the part is ``text[:end]``, the rest starts at ``resume``
    (``resume == end + 1`` when a whitespace separator is dropped).
    """
    w = _window(text, budget)
    spaces = [
        i
        for i in range(1, min(w, len(text) - 1) + 1)
        if text[i].isspace() and is_boundary(text, i) and is_boundary(text, i + 1)
    ]
    half = w // 2
    for i in reversed(spaces):
        if i < half:
            break
        if _is_sentence_cut(text, i):
            return i, i + 1
    for i in range(w, half - 1, -1):  # CJK sentences have no space after their full stop
        if 0 < i < len(text) and text[i - 1] in _CJK_FULL_STOPS and is_boundary(text, i):
            return i, i
    if spaces and spaces[-1] >= half:
        return spaces[-1], spaces[-1] + 1
    # No space in the second half of the window: cutting at an early space would waste a
    # packet ("Hello, <220-byte link>" went out as 12 + 200 + 45 bytes); cut the long word.
    for i in range(w, 0, -1):
        if is_boundary(text, i):
            return i, i
    # One cluster longer than a packet: cut between code points, if possible not before an
    # extender (a combining mark or ZWJ stays with what precedes it).
    for i in range(w, 0, -1):
        if not _is_extender(text[i]):
            return i, i
    return max(w, 1), max(w, 1)


def split_parts(text: str, *, chunk_bytes: int, max_parts: int | None = None) -> list[Part]:
    """Cut ``normalize(text)`` into parts that fit a packet once numbered (no shortening).

    ``max_parts`` only sizes the numbering prefix; the result may have more parts (``fit``
    shortens the text so that it does not), and then the prefix is sized to the real count, so
    every rendered part still fits ``chunk_bytes``.
    """
    text = normalize(text)
    if not text:
        return []
    if utf8_len(text) <= chunk_bytes:
        return [Part(text, "")]
    prefix = _prefix_len(max(max_parts or 0, 9))
    while True:  # 10 or more parts need a wider "(10/12) ": split again with that width
        parts = _split(text, chunk_bytes - prefix, chunk_bytes)
        if _prefix_len(len(parts)) <= prefix:
            return parts
        prefix = _prefix_len(len(parts))


def _split(text: str, budget: int, chunk_bytes: int) -> list[Part]:
    if budget < 8:
        raise ValueError(f"chunk_bytes {chunk_bytes} leaves no room after the numbering")
    parts: list[Part] = []
    rest = text
    while rest:
        if utf8_len(rest) <= budget:
            parts.append(Part(rest, ""))
            break
        end, resume = _cut(rest, budget)
        parts.append(Part(rest[:end], rest[end:resume]))
        rest = rest[resume:]
    return parts


def reassemble(parts: list[Part]) -> str:
    return "".join(p.body + p.sep for p in parts)


def render_parts(parts: list[Part]) -> list[str]:
    """The texts that go on air: numbered ``(i/n) `` only when there is more than one part."""
    if len(parts) <= 1:
        return [p.body for p in parts]
    n = len(parts)
    return [f"({i}/{n}) {p.body}" for i, p in enumerate(parts, 1)]


def _candidates(text: str, limit: int) -> tuple[list[int], list[int], list[int]]:
    """Cut positions (descending) whose prefix fits ``limit`` bytes: sentence, word, cluster."""
    sentence: list[int] = []
    word: list[int] = []
    cluster: list[int] = []
    used = 0
    for i, ch in enumerate(text):
        if used > limit:
            break
        if i > 0 and is_boundary(text, i):
            cluster.append(i)
            if ch.isspace():
                word.append(i)
                if _is_sentence_cut(text, i):
                    sentence.append(i)
            elif text[i - 1] in _CJK_FULL_STOPS:
                sentence.append(i)
        used += utf8_len(ch)
    return sentence[::-1], word[::-1], cluster[::-1]


def fit(text: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_parts: int = 3) -> str:
    """What will be sent for ``text``: normalized, shortened with ``MARKER`` to ``max_parts``."""
    return fit_more(text, chunk_bytes=chunk_bytes, max_parts=max_parts)[0]


def fit_more(
    text: str,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_parts: int = 3,
    marker: str = MARKER,
) -> tuple[str, str | None]:
    """``(what is sent now, the rest)``: like ``fit`` with ``marker`` where it was cut; the
    rest (normalized, None when nothing was cut) is what ``!more`` sends next."""
    text = normalize(text)
    if len(split_parts(text, chunk_bytes=chunk_bytes, max_parts=max_parts)) <= max_parts:
        return text, None
    if max_parts == 1:
        capacity = chunk_bytes
    else:
        capacity = max_parts * (chunk_bytes - _prefix_len(max(max_parts, 9)))
    limit = capacity - utf8_len(marker)
    sentence, word, cluster = _candidates(text, limit)
    # A sentence cut is preferred unless it throws away more than half of what would fit.
    sentence = [i for i in sentence if utf8_len(text[:i]) * 2 >= limit]
    for options in (sentence, word, cluster):
        for i in options:
            shortened = normalize(text[:i]) + marker
            if len(split_parts(shortened, chunk_bytes=chunk_bytes, max_parts=max_parts)) <= (
                max_parts
            ):
                return shortened, normalize(text[i:]) or None
    return marker.strip(), text
