"""Text fitting for mesh packets: byte budgets, numbering, grapheme safety, stable ``fit``."""

from __future__ import annotations

import itertools

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.transports.mesh_text import (
    MARKER,
    fit,
    fit_more,
    graphemes,
    normalize,
    reassemble,
    render_parts,
    split_parts,
    utf8_len,
)

CHUNK = 200


def sent(text: str, *, max_parts: int = 3, chunk: int = CHUNK) -> list[str]:
    return render_parts(
        split_parts(
            fit(text, chunk_bytes=chunk, max_parts=max_parts),
            chunk_bytes=chunk,
            max_parts=max_parts,
        )
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  hello \n\n world  ", "hello\nworld"),
        ("a\t\tb", "a b"),
        ("a\r\nb", "a\nb"),
        ("", ""),
        (" \n ", ""),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize(text) == expected
    assert normalize(expected) == expected


def test_short_text_is_one_unnumbered_part() -> None:
    assert sent("Sunny, 21 C.") == ["Sunny, 21 C."]
    assert sent("x" * 200) == ["x" * 200]


def test_long_text_is_numbered_and_cut_at_sentences() -> None:
    s1 = "The first sentence is here and it is rather long, about eighty bytes in total."
    s2 = "Then a second sentence follows, which is also fairly long to push the limit."
    s3 = "A third sentence ends it, and it is long enough to need a second packet."
    parts = sent(f"{s1} {s2} {s3}")
    assert parts == [f"(1/2) {s1} {s2}", f"(2/2) {s3}"]
    assert all(utf8_len(p) <= CHUNK for p in parts)


def test_too_long_is_shortened_at_a_sentence_with_marker() -> None:
    sentence = "This sentence has exactly sixty bytes of text in it, okay. "
    text = sentence * 20
    fitted = fit(text)
    parts = sent(text)
    assert len(parts) == 3
    assert fitted.endswith("okay." + MARKER)
    assert all(utf8_len(p) <= CHUNK for p in parts)
    assert parts[-1].endswith(MARKER)


def test_max_parts_one_shortens_to_one_packet() -> None:
    parts = sent("word " * 100, max_parts=1)
    assert len(parts) == 1 and utf8_len(parts[0]) <= CHUNK and parts[0].endswith(MARKER)


def test_cjk_without_spaces_cuts_after_full_stops() -> None:
    text = "今日は晴れです。" * 30  # 24 bytes per sentence, no spaces
    parts = split_parts(fit(text), chunk_bytes=CHUNK, max_parts=3)
    assert all(p.body.endswith(("。", MARKER)) for p in parts)


def test_never_splits_a_zwj_family_or_flag() -> None:
    family = "👨‍👩‍👧‍👦"  # 25 bytes, one cluster
    text = family * 30
    for part in split_parts(fit(text), chunk_bytes=CHUNK, max_parts=3):
        body = part.body.removesuffix(MARKER)
        assert set(graphemes(body)) == {family}
    flags = "🇫🇷🇩🇪" * 40
    for part in split_parts(fit(flags), chunk_bytes=CHUNK, max_parts=3):
        assert utf8_len(part.body.removesuffix(MARKER)) % 8 == 0


@pytest.mark.parametrize("size", [2_500, 25_000])
def test_unfitted_text_of_ten_or_more_parts_still_fits_each_packet(size: int) -> None:
    parts = split_parts("x" * size, chunk_bytes=CHUNK, max_parts=3)  # not shortened by fit
    on_air = render_parts(parts)
    assert len(on_air) >= 10 and all(utf8_len(p) <= CHUNK for p in on_air)
    assert reassemble(parts) == "x" * size


def test_single_giant_cluster_is_still_cut_to_fit() -> None:
    text = "a" + "\u0301" * 300  # one cluster of 601 bytes
    assert all(utf8_len(p) <= CHUNK for p in sent(text))


# Characters chosen so that our conservative cluster rules and regex's \X agree.
ALPHABET = [
    "a",
    "b",
    "Z",
    "1",
    " ",
    " ",
    "\n",
    ".",
    "!",
    "?",
    ",",
    "é",
    "ñ",
    "ü",
    "ß",
    "e\u0301",
    "\u0308",
    "日",
    "本",
    "語",
    "中",
    "文",
    "。",
    "한",
    "국",
    "😀",
    "👍",
    "👍🏽",
    "❤️",
    "👨‍👩‍👧",
    "🏳️‍🌈",
    "1️⃣",
    "🇫🇷",
    "🇯🇵",
    "🇦",
    "\u200d",
    "…",
    "“",
    "”",
]
texts = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=700).map("".join)
NO_SPACES = [c for c in ALPHABET if not c.isspace()]
dense = st.lists(st.sampled_from(NO_SPACES), min_size=1, max_size=700).map("".join)
CLUSTERS = ["e\u0301", "👍🏽", "❤️", "👨‍👩‍👧", "🏳️‍🌈", "1️⃣", "🇫🇷", "🇯🇵", "a", "日"]
clustered = st.lists(st.sampled_from(CLUSTERS), min_size=40, max_size=400).map("".join)


def assert_fits(text: str, max_parts: int) -> None:
    fitted = fit(text, chunk_bytes=CHUNK, max_parts=max_parts)
    parts = split_parts(fitted, chunk_bytes=CHUNK, max_parts=max_parts)
    on_air = render_parts(parts)
    assert len(parts) <= max_parts
    assert all(0 < utf8_len(p) <= CHUNK for p in on_air)
    for p in on_air:
        p.encode("utf-8").decode("utf-8")  # each packet alone is valid UTF-8
    assert reassemble(parts) == fitted
    assert fit(fitted, chunk_bytes=CHUNK, max_parts=max_parts) == fitted
    # What the radio sends, numbering removed, is the stored text (separators aside) ...
    n = len(parts)
    bodies = [p.removeprefix(f"({i}/{n}) ") if n > 1 else p for i, p in enumerate(on_air, 1)]
    assert bodies == [p.body for p in parts]
    # ... and the stored text is the reply itself, or a prefix of it with the marker.
    whole = normalize(text)
    if fitted != whole:
        assert fitted.endswith(MARKER.strip())
        assert whole.startswith(fitted.removesuffix(MARKER).removesuffix(MARKER.strip()))
        assert len(split_parts(whole, chunk_bytes=CHUNK, max_parts=max_parts)) > max_parts
    if n > 1:
        assert [p.split(" ", 1)[0] for p in on_air] == [f"({i}/{n})" for i in range(1, n + 1)]
    # Every cut is a grapheme-cluster boundary according to an independent implementation,
    # except inside a single cluster too long for any packet (the documented last resort).
    spans: list[tuple[int, int]] = []
    pos = 0
    for cluster in regex.findall(r"\X", fitted):
        spans.append((pos, pos + len(cluster)))
        pos += len(cluster)
    bounds = {0} | {end for _, end in spans}

    def allowed(cut: int) -> bool:
        if cut in bounds:
            return True
        start, end = next((a, b) for a, b in spans if a < cut < b)
        return utf8_len(fitted[start:end]) > CHUNK - len("(9/9) ")

    pos = 0
    for part in parts[:-1]:
        pos += len(part.body)
        assert allowed(pos), (fitted, pos)
        pos += len(part.sep)
        assert allowed(pos), (fitted, pos)


def exactly(n: int, pieces: list[str]) -> str:
    """``pieces`` repeated up to ``n`` UTF-8 bytes, padded with ASCII to exactly ``n``."""
    out: list[str] = []
    used = 0
    for piece in itertools.cycle(pieces):
        if used + utf8_len(piece) > n:
            break
        out.append(piece)
        used += utf8_len(piece)
    return "".join(out) + "a" * (n - used)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(texts, dense, clustered).filter(lambda t: 1 <= utf8_len(t) <= 2000),
    st.integers(1, 5),
)
def test_property_every_part_fits_and_reassembles(text: str, max_parts: int) -> None:
    assert_fits(text, max_parts)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 2000),
    st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=40),
    st.integers(1, 5),
)
def test_property_any_byte_length_up_to_2000(n: int, pieces: list[str], max_parts: int) -> None:
    text = exactly(n, pieces)  # lengths drawn uniformly, not only what short lists reach
    assert utf8_len(text) == n
    assert_fits(text, max_parts)


MIXED = ["Héllo", " ", "日本語", "。", "👨‍👩‍👧", " ", "naïve", ". ", "🇫🇷", "e\u0301"]
MIXED += ["👍🏽", "한국", "❤️", " ", "word", "! ", "🏳️‍🌈", "ß", "\n", "中文", "1️⃣", "? "]


def test_every_byte_length_from_1_to_2000() -> None:
    """Exhaustive: emoji, ZWJ sequences, flags, CJK and accents at every length, each length
    starting at a different point of the mix so that cuts land everywhere."""
    for n in range(1, 2001):
        shift = n % len(MIXED)
        text = exactly(n, MIXED[shift:] + MIXED[:shift])
        assert utf8_len(text) == n
        assert_fits(text, 3)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=600), st.integers(1, 12))
def test_property_arbitrary_unicode_fits(text: str, max_parts: int) -> None:
    fitted = fit(text, chunk_bytes=CHUNK, max_parts=max_parts)
    parts = split_parts(fitted, chunk_bytes=CHUNK, max_parts=max_parts)
    assert len(parts) <= max_parts
    assert all(utf8_len(p) <= CHUNK for p in render_parts(parts))
    assert reassemble(parts) == fitted
    assert fit(fitted, chunk_bytes=CHUNK, max_parts=max_parts) == fitted


@pytest.mark.parametrize("n", [1, 2, 50, 199, 200, 201, 560, 561, 1000, 2000])
def test_every_length_of_accented_text(n: int) -> None:
    text = ("é" * n)[: n // 2] + ("a" if n % 2 else "")  # n bytes of mixed 1- and 2-byte chars
    assert_fits(text, 3)


def test_flags_joined_by_zwj_are_separate_clusters() -> None:
    """Regression (hypothesis): regional indicators are not pictographs, so a ZWJ between two
    flags joins nothing and a cut may fall after it, never inside a flag."""
    assert_fits(exactly(201, ["🇫🇷", "\u200d"]), 2)


def test_no_wasted_packets_for_a_short_word_before_a_long_one() -> None:
    text = "Hello, " + "x" * 226  # 233 bytes: went out as 12 + 200 + 45 bytes
    parts = render_parts(split_parts(text, chunk_bytes=200, max_parts=3))
    assert len(parts) == 2 and all(len(p.encode()) <= 200 for p in parts)
    assert len(parts[0].encode()) == 200


def test_fit_more_returns_the_rest_for_more() -> None:
    text = " ".join(f"Sentence {i} is here." for i in range(80))
    shown, rest = fit_more(text, chunk_bytes=200, max_parts=3, marker=" … (!more)")
    assert shown.endswith(" … (!more)") and rest is not None
    assert normalize(shown.removesuffix(" … (!more)") + " " + rest) == normalize(text)
    assert fit_more("short", chunk_bytes=200, max_parts=3) == ("short", None)
