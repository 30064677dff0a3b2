"""Pure Discord text fitting: table tests and properties for split_message/fit_text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.transports.discord_text import (
    DISCORD_MAX_CHARS,
    TRUNCATED,
    _fence_toggle,
    fit_text,
    readable,
    split_message,
    strip_mentions,
    units,
)


def fence_lines(part: str) -> list[str]:
    return [line for line in part.split("\n") if _fence_toggle(line) is not None]


def content(text: str) -> str:
    """Text without fence lines and without whitespace: what no split may lose or repeat."""
    kept = [line for line in text.split("\n") if _fence_toggle(line) is None]
    return "".join("".join(kept).split())


def code_answer() -> str:
    intro = "Here is how to read the sensor. " * 20
    code = "\n".join(f"    value_{i} = sensor.read({i})  # channel {i}" for i in range(90))
    outro = "That is all. " * 40
    return f"{intro}\n\n```python\n{code}\n```\n\n{outro}"


def test_five_thousand_chars_with_a_code_block() -> None:
    text = code_answer()
    assert 4500 < len(text) < 6000
    parts = split_message(text)
    assert len(parts) == 3
    assert all(0 < len(p) <= DISCORD_MAX_CHARS for p in parts)
    assert all(len(fence_lines(p)) % 2 == 0 for p in parts), "every part closes its fences"
    # The code block is cut across parts: closed at the end, reopened with its language.
    assert parts[0].endswith("\n```")
    assert parts[1].startswith("```python\n    value_")
    assert content("\n".join(parts)) == content(text)
    # Prose before the code ends the first part on a paragraph, never inside a word.
    assert parts[0].startswith("Here is how")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hello", ["hello"]),
        ("\r\n\r\nhello\r\nworld  \n\n", ["hello\nworld"]),
        ("", []),
        ("   \n\n  ", []),
        ("```py\nprint(1)", ["```py\nprint(1)\n```"]),  # an unclosed fence is closed
        ("use ```x``` inline", ["use ```x``` inline"]),
    ],
)
def test_small_texts(text: str, expected: list[str]) -> None:
    assert split_message(text) == expected


@pytest.mark.parametrize(
    ("text", "first_ends_with"),
    [
        ("a" * 150 + "\n\n" + "b" * 100, "a"),  # paragraph
        ("a" * 150 + "\n" + "b" * 100, "a"),  # line
        ("Word " * 20 + "End here. " + "more words " * 20, "here."),  # sentence
        ("word " * 60, "word"),  # space
    ],
)
def test_cut_preferences(text: str, first_ends_with: str) -> None:
    parts = split_message(text, limit=200)
    assert len(parts) >= 2
    assert parts[0].endswith(first_ends_with)
    assert not parts[1].startswith((" ", "\n"))


def test_sentence_beats_space() -> None:
    text = "First sentence is here. " + "then many words without a stop " * 6
    parts = split_message(text, limit=200)
    assert parts[0].count(".") == 1 or parts[0].endswith(".")


def test_hard_cut_when_no_boundary() -> None:
    parts = split_message("x" * 450, limit=200)
    assert "".join(parts) == "x" * 450
    assert all(len(p) <= 200 for p in parts)


def test_emoji_count_as_two_units() -> None:
    parts = split_message("😀" * 3000)
    assert all(units(p) <= DISCORD_MAX_CHARS for p in parts)
    assert sum(len(p) for p in parts) == 3000


def test_combining_mark_stays_with_its_letter() -> None:
    text = "e\u0301" * 300  # é as e + combining acute
    for part in split_message(text, limit=201):
        assert not part.startswith("\u0301")


def test_bare_opening_fence_moves_to_next_part() -> None:
    text = "p" * 180 + "\n```js\n" + "let a = 1;\n" * 10 + "```"
    parts = split_message(text, limit=200)
    assert parts[0] == "p" * 180
    assert parts[1].startswith("```js\nlet a")


def test_long_language_tag_not_repeated() -> None:
    text = "```" + "x" * 40 + "\n" + "line\n" * 80 + "```"
    parts = split_message(text, limit=200)
    assert len(parts) > 1
    assert parts[1].startswith("```\n")


def test_fit_keeps_short_answers() -> None:
    assert fit_text("  hi there\r\n", max_parts=4) == "hi there"


def test_fit_cuts_to_max_parts_and_is_idempotent() -> None:
    text = code_answer() * 3
    fitted = fit_text(text, max_parts=2)
    assert fitted.endswith(TRUNCATED)
    parts = split_message(fitted)
    assert len(parts) == 2
    assert parts[-1].endswith(TRUNCATED)
    assert all(len(fence_lines(p)) % 2 == 0 for p in parts)
    assert fit_text(fitted, max_parts=2) == fitted
    assert content(text).startswith(content(fitted.removesuffix(TRUNCATED)))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<@42> hello", "hello"),
        ("hey <@!42>, what is up", "hey , what is up"),
        ("<@&7> roles too", "roles too"),
        ("<@43> someone else", "<@43> someone else"),
    ],
)
def test_strip_mentions(text: str, expected: str) -> None:
    assert strip_mentions(text, user_ids=[42], role_ids=[7]) == expected


pieces = st.sampled_from(
    ["word", " ", "\n", "\n\n", ". ", "```py\n", "\n```\n", "😀", "e\u0301", "x" * 30, "a b c "]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(pieces, max_size=120), st.integers(min_value=128, max_value=400))
def test_split_properties(chunks: list[str], limit: int) -> None:
    text = "".join(chunks)
    parts = split_message(text, limit=limit)
    for part in parts:
        assert part.strip()
        assert units(part) <= limit
        assert len(fence_lines(part)) % 2 == 0
    assert content("\n".join(parts)) == content(text)


@settings(max_examples=150, deadline=None)
@given(st.lists(pieces, max_size=200), st.integers(min_value=1, max_value=3))
def test_fit_properties(chunks: list[str], max_parts: int) -> None:
    fitted = fit_text("".join(chunks), limit=300, max_parts=max_parts)
    assert len(split_message(fitted, limit=300)) <= max_parts
    assert fit_text(fitted, limit=300, max_parts=max_parts) == fitted


def test_readable_names_mentions_channels_emoji_and_timestamps() -> None:
    text = (
        "<@1> and <@!2> ask <@&3> in <#4> <:party:55> <a:wave:66> at <t:0:R>; "
        "<@9> <@&9> <#9> {not a code} <@abc>"
    )
    out = readable(text, users={1: "Alice", 2: "Bob"}, roles={3: "mods"}, channels={4: "general"})
    assert out == (
        "@Alice and @Bob ask @mods in #general :party: :wave: at 1970-01-01 00:00 UTC; "
        "@unknown-user @unknown-role #unknown-channel {not a code} <@abc>"
    )


def test_fill_prompt_replaces_only_date_and_time() -> None:
    from datetime import UTC, datetime

    from bot.text import fill_prompt

    now = datetime(2026, 11, 23, 15, 4, tzinfo=UTC)
    assert fill_prompt("Today is {date}, {time}. {other}", now) == (
        "Today is 2026-11-23, Monday, 15:04 UTC. {other}"
    )
