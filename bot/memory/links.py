"""Link codes for joining one person's DM memory across two transports (``!link``).

Invariants:
- A code is 6 random digits (``secrets``), valid for ``CODE_TTL`` seconds, used at most once;
  a person holds at most one live code (a new ``!link`` replaces it).
- ``redeem`` answers the same way for a wrong, expired or used code, so a guess learns nothing
  about other codes; each (transport, person) gets ``MAX_ATTEMPTS`` tries per ``CODE_TTL``
  (right or wrong), so guessing one of 10^6 codes within its lifetime is hopeless.
- A code redeemed on the transport that issued it does nothing (it must prove the *other*
  account). Codes live in memory only: a restart voids them, which is safe.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from bot.domain import DM_SPACE, ConversationKey

CODE_TTL = 600.0
MAX_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class _Code:
    key: ConversationKey
    expires: float


class LinkCodes:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._codes: dict[str, _Code] = {}
        self._attempts: dict[tuple[str, str], deque[float]] = {}

    def issue(self, transport: str, person: str) -> str:
        now = self._clock()
        key = ConversationKey(transport, person, DM_SPACE)
        for code, live in list(self._codes.items()):
            if live.key == key or live.expires <= now:
                del self._codes[code]
        while True:
            code = f"{secrets.randbelow(10**6):06d}"
            if code not in self._codes:
                break
        self._codes[code] = _Code(key, now + CODE_TTL)
        return code

    def allowed(self, transport: str, person: str) -> bool:
        """Count one attempt; False when this account used up its tries for now."""
        now = self._clock()
        stamps = self._attempts.setdefault((transport, person), deque())
        while stamps and now - stamps[0] > CODE_TTL:
            stamps.popleft()
        if len(stamps) >= MAX_ATTEMPTS:
            return False
        stamps.append(now)
        return True

    def redeem(self, code: str, transport: str) -> ConversationKey | None:
        """The issuing DM for a live code from another transport (the code is then spent)."""
        live = self._codes.get(code.strip())
        if live is None or live.expires <= self._clock() or live.key.transport == transport:
            return None
        del self._codes[code.strip()]
        return live.key
