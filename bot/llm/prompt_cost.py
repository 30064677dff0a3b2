"""What a prompt costs a server: the pure arithmetic the LLM gate learns and estimates with.

Invariants:
- Nothing here keeps state or reads a clock: the gate (``bot.llm.gate``) owns both.
- ``render`` lays a request out close to how a chat template does, so the common prefix of two
  renderings is what a KV-cache server reuses between them (in characters).
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.llm.port import ChatMessage

RATE_WEIGHT = 0.3  # EWMA weight of the newest measurement


def line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(start, slope) of the least-squares line through (tokens, seconds), both >= 0; with
    tokens all alike, no latency and the mean cost per token."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    slope = sum((t - mean_t) * (s - mean_s) for t, s in points) / var if var else 0.0
    if slope <= 0:
        total = sum(t for t, _ in points)
        return 0.0, (sum(s for _, s in points) / total if total else 0.0)
    start = mean_s - slope * mean_t
    if start < 0:
        return 0.0, sum(s for _, s in points) / max(1, sum(t for t, _ in points))
    return start, slope


def ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - RATE_WEIGHT) * old + RATE_WEIGHT * new


def render(messages: Sequence[ChatMessage]) -> str:
    """A request as a flat string, close to how a chat template lays it out (for prefixes)."""
    return "".join(f"<{m.role}>{m.content}</>" for m in messages) + "<assistant>"


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on slices: C-speed comparisons
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
