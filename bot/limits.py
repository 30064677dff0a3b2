"""Per-person limits on the way in: the rate limit, the queue limit and one notice per window.

The responder (``bot.responder``) asks before it queues a message or a command; operators are
exempt (the responder does not ask for them).

Invariants:
- A person (transport, sender) may send at most ``rate_limit.messages`` messages per
  ``rate_limit.per_seconds`` and have at most ``queue_limit`` turns waiting; a message over
  either limit gets the text of one polite notice back, and is not counted as sent.
- One notice per limit window per person: a flood must never make the bot flood back.
- The tables shrink as they go: people with no recent message and notices older than the
  window are dropped, so memory stays the size of the set of active people.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from bot.config import BotConfig


class PersonLimits:
    def __init__(self, *, config: BotConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._recent: dict[tuple[str, str], deque[float]] = {}
        self._noticed: dict[tuple[str, str], float] = {}

    def over(self, who: tuple[str, str], *, queued: int) -> str | None:
        """The notice for a person over a limit (``queued`` turns waiting), or None (and the
        message counts against the rate limit)."""
        if queued >= self._config.queue_limit:
            return (
                f"You have {queued} messages waiting; I'll answer those first. "
                "Please wait for my reply."
            )
        rl = self._config.rate_limit
        now = self._clock()
        stamps = self._recent.setdefault(who, deque())
        while stamps and now - stamps[0] > rl.per_seconds:
            stamps.popleft()
        for stale in [k for k, v in self._recent.items() if not v and k != who]:
            del self._recent[stale]  # keep the table as small as the set of active people
        for stale in [k for k, t in self._noticed.items() if now - t > rl.per_seconds]:
            del self._noticed[stale]
        if len(stamps) >= rl.messages:
            wait = int(rl.per_seconds - (now - stamps[0])) + 1
            return (
                f"Slow down: at most {rl.messages} messages per {int(rl.per_seconds)} s. "
                f"Try again in {wait} s."
            )
        stamps.append(now)
        return None

    def may_notice(self, who: tuple[str, str]) -> bool:
        """True (and remembered) when no notice went to ``who`` within the window."""
        now = self._clock()
        if now - self._noticed.get(who, -1e18) < self._config.rate_limit.per_seconds:
            return False  # one notice per window: a flood must not make us flood back
        self._noticed[who] = now
        return True
