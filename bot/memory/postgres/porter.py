"""SQLite FTS5's ``porter`` stemmer in Python, so PostgreSQL's words stem exactly as SQLite's.

PostgreSQL's Snowball ``porter`` is a different reading of Porter's algorithm: it stems words
of one or two letters ("us" -> "u") and undoubles differently in step 1b ("trekked" ->
"trekk"), so the two backends found different messages for a few common words. This module
follows ``fts5PorterCb`` of SQLite's ext/fts5/fts5_tokenize.c rule for rule, quirks included:

- it works on the token's UTF-8 bytes (a non-ASCII byte is a consonant), and a token shorter
  than 3 bytes or longer than 64 passes through unchanged;
- within a step, the first listed suffix the word ends with (and is strictly longer than)
  decides: if its condition fails, no later suffix of that step is tried;
- "y" is a vowel after a consonant when measuring, but anywhere past the first letter when
  step 1b and 1c ask whether the stem holds a vowel.

Invariants: ``stem`` is pure and cached; tests/test_porter.py compares it with the real FTS5
over every word of the LoCoMo conversations and a generated list covering every rule.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

MAX_TOKEN = 64  # bytes; longer tokens are not stemmed (FTS5_PORTER_MAX_TOKEN)
_VOWELS = frozenset(b"aeiou")
_Y = ord("y")


def _is_vowel(c: int, y_is_vowel: bool) -> bool:
    return c in _VOWELS or (y_is_vowel and c == _Y)


def _gobble_vc(w: bytes, start: int, end: int, cons: bool) -> int:
    """Past the first vowel-then-consonant run of w[start:end]: the index after it (relative to
    ``start``, plus one), or 0 if there is none. ``cons``: was the letter before a consonant."""
    i = start
    while i < end:
        cons = not _is_vowel(w[i], cons)
        if not cons:
            break
        i += 1
    i += 1
    while i < end:
        cons = not _is_vowel(w[i], cons)
        if cons:
            return i - start + 1
        i += 1
    return 0


def _m_gt0(w: bytes, n: int) -> bool:
    return _gobble_vc(w, 0, n, False) > 0


def _m_gt1(w: bytes, n: int) -> bool:
    k = _gobble_vc(w, 0, n, False)
    return k > 0 and _gobble_vc(w, k, n, True) > 0


def _m_eq1(w: bytes, n: int) -> bool:
    k = _gobble_vc(w, 0, n, False)
    return k > 0 and _gobble_vc(w, k, n, True) == 0


def _o_star(w: bytes, n: int) -> bool:
    """The stem ends consonant-vowel-consonant, the last not w, x or y."""
    if w[n - 1] in b"wxy":
        return False
    mask = 0
    cons = False
    for i in range(n):
        cons = not _is_vowel(w[i], cons)
        mask = (mask << 1) + cons
    return (mask & 7) == 5


def _m_gt1_s_or_t(w: bytes, n: int) -> bool:
    return w[n - 1] in b"st" and _m_gt1(w, n)


def _has_vowel(w: bytes, n: int) -> bool:
    return any(_is_vowel(w[i], i > 0) for i in range(n))


Cond = Callable[[bytes, int], bool]
Rule = tuple[bytes, Cond, bytes]


def _rules(cond: Cond, pairs: str) -> list[Rule]:
    """'suffix>output' pairs, space-separated, in FTS5's order."""
    out: list[Rule] = []
    for pair in pairs.split():
        suffix, _, output = pair.partition(">")
        out.append((suffix.encode(), cond, output.encode()))
    return out


_STEP1B: list[Rule] = [(b"eed", _m_gt0, b"ee"), (b"ed", _has_vowel, b""), (b"ing", _has_vowel, b"")]
_STEP1B2 = (b"at", b"bl", b"iz")  # each gets an "e"
_STEP2 = _rules(
    _m_gt0,
    "ational>ate tional>tion enci>ence anci>ance izer>ize logi>log bli>ble alli>al entli>ent "
    "eli>e ousli>ous ization>ize ation>ate ator>ate alism>al iveness>ive fulness>ful "
    "ousness>ous aliti>al iviti>ive biliti>ble",
)
_STEP3 = _rules(_m_gt0, "ical>ic ness> icate>ic iciti>ic ful> ative> alize>al")
_STEP4 = [
    *_rules(_m_gt1, "al> ance> ence> er> ic> able> ible> ant> ement> ment> ent>"),
    (b"ion", _m_gt1_s_or_t, b""),
    *_rules(_m_gt1, "ou> ism> ate> iti> ous> ive> ize>"),
]


def _apply(w: bytes, rules: list[Rule]) -> tuple[bytes, bytes]:
    """The first rule whose suffix ends ``w`` (and is shorter than it) decides; returns the
    word and the suffix removed (b"" if none was)."""
    n = len(w)
    for suffix, cond, output in rules:
        k = len(suffix)
        if n > k and w.endswith(suffix):
            if cond(w, n - k):
                return w[: n - k] + output, suffix
            break
    return w, b""


def _step1a(w: bytes) -> bytes:
    n = len(w)
    if w[-1] != ord("s"):
        return w
    if w[-2] == ord("e"):
        if (n > 4 and w[-4:-2] == b"ss") or (n > 3 and w[-3] == ord("i")):
            return w[:-2]
        return w[:-1]
    return w if w[-2] == ord("s") else w[:-1]


@lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """``word`` (one folded token) as FTS5's porter tokenizer stems it."""
    w = word.encode()
    if len(w) > MAX_TOKEN or len(w) < 3:
        return word
    w = _step1a(w)
    w, removed = _apply(w, _STEP1B)
    if removed in (b"ed", b"ing"):
        w = _after_1b(w)
    # Step 1c
    if w[-1] == _Y and _has_vowel(w, len(w) - 1):
        w = w[:-1] + b"i"
    w, _ = _apply(w, _STEP2)
    w, _ = _apply(w, _STEP3)
    w, _ = _apply(w, _STEP4)
    # Step 5a
    n = len(w)
    if w[-1] == ord("e") and (_m_gt1(w, n - 1) or (_m_eq1(w, n - 1) and not _o_star(w, n - 1))):
        w = w[:-1]
    # Step 5b
    n = len(w)
    if n > 1 and w.endswith(b"ll") and _m_gt1(w, n - 1):
        w = w[:-1]
    return w.decode("utf-8", errors="replace")  # (bytes cut mid-character: FTS5 keeps them)


def _after_1b(w: bytes) -> bytes:
    """After step 1b removed "ed" or "ing": at/bl/iz get their "e" back, a doubled consonant
    (not l, s, z) is undoubled, and a short consonant-vowel-consonant stem gets an "e"."""
    n = len(w)
    if n > 2 and w[-2:] in _STEP1B2:
        return w + b"e"
    c = w[-1]
    if not _is_vowel(c, False) and c not in b"lsz" and n > 1 and c == w[-2]:
        return w[:-1]
    if _m_eq1(w, n) and _o_star(w, n):
        return w + b"e"
    return w
