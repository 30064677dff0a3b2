"""Token counting works with networking blocked and writes no cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bot.llm.tokens import EstimateCounter, make_counter

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


def test_estimate_is_safe_for_multibyte_text() -> None:
    est = EstimateCounter()
    assert est.count("😀" * 10) >= make_counter().count("😀" * 10) // 2
    assert est.count("abc") == 1
