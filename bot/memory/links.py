"""Link codes for joining one person's DM memory across two transports (``!link``).

Invariants:
- A code is 6 random digits (``secrets``), valid for ``CODE_TTL`` seconds, used at most once;
  a person holds at most one live code (a new ``!link`` replaces it).
- Codes live in the store, hashed (the table never holds a code as typed), so every gateway
  sharing the store and a restart honour them. Redeeming is one atomic delete of the live
  row: a code redeemed twice at once, on two gateways, is won by exactly one.
- ``redeem`` answers the same way for a wrong, expired or used code, so a guess learns nothing
  about other codes. Failed redemptions are counted in the store: each (transport, person)
  gets ``MAX_ATTEMPTS`` failures per ``CODE_TTL``, and the whole code space gets
  ``MAX_FAILURES`` (every account together), so fresh accounts cannot share out the guessing:
  at most ``MAX_FAILURES`` guesses per 10 minutes against 10^6 codes.
- A code redeemed on the transport that issued it does nothing (it must prove the *other*
  account) and is not spent.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Protocol

from bot.domain import DM_SPACE, ConversationKey

CODE_TTL = 600.0
MAX_ATTEMPTS = 5  # failures per account per CODE_TTL
MAX_FAILURES = 30  # failures of all accounts together per CODE_TTL


class CodeStore(Protocol):
    """What link codes need from the memory store (both backends implement it)."""

    async def save_link_code(
        self, code_hash: str, transport: str, person: str, *, expires_at: float, now: float
    ) -> bool: ...

    async def take_link_code(
        self, code_hash: str, *, transport: str, now: float
    ) -> tuple[str, str] | None: ...

    async def note_link_failure(self, transport: str, person: str, *, now: float) -> None: ...

    async def link_failures(self, *, since: float) -> tuple[int, dict[tuple[str, str], int]]: ...


def code_hash(code: str) -> str:
    return hashlib.sha256(f"meshsage-link:{code.strip()}".encode()).hexdigest()


class LinkCodes:
    def __init__(self, store: CodeStore, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def issue(self, transport: str, person: str) -> str:
        now = self._clock()
        while True:
            code = f"{secrets.randbelow(10**6):06d}"
            if await self._store.save_link_code(
                code_hash(code), transport, person, expires_at=now + CODE_TTL, now=now
            ):
                return code

    async def allowed(self, transport: str, person: str) -> bool:
        """False while this account, or all accounts together, used up their failures."""
        total, per = await self._store.link_failures(since=self._clock() - CODE_TTL)
        return total < MAX_FAILURES and per.get((transport, person), 0) < MAX_ATTEMPTS

    async def redeem(self, code: str, transport: str, person: str) -> ConversationKey | None:
        """The issuing DM for a live code from another transport (the code is then spent);
        None (and one failure counted) otherwise."""
        now = self._clock()
        found = None
        if code.strip().isdigit() and len(code.strip()) == 6:
            found = await self._store.take_link_code(code_hash(code), transport=transport, now=now)
        if found is None:
            await self._store.note_link_failure(transport, person, now=now)
            return None
        return ConversationKey(found[0], found[1], DM_SPACE)
