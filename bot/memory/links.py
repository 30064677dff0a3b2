"""Link codes for joining one person's DM memory across two transports (``!link``).

Invariants:
- A code is 6 random digits (``secrets``), valid for ``CODE_TTL`` seconds, used at most once;
  a person holds at most one live code (a new ``!link`` replaces it). During a guessing storm
  (``MAX_FAILURES`` failures of all accounts together within ``CODE_TTL``) new codes have
  ``LONG_DIGITS`` digits, so guessing from many accounts gets nowhere.
- Codes live in the store, hashed (the table never holds a code as typed), so every gateway
  sharing the store and a restart honour them. Redeeming is one atomic delete of the live
  row: a code redeemed twice at once, on two gateways, is won by exactly one.
- ``redeem`` answers the same way for a wrong, expired or used code, so a guess learns nothing
  about other codes. Failed redemptions are counted in the store: each (transport, person)
  gets ``MAX_ATTEMPTS`` failures per ``CODE_TTL``; that is the only refusal, so a person's
  right code is never refused because of other accounts' guesses (a global cap let six
  accounts block every honest link). What other accounts' guesses cost is a longer code for
  whoever asks next; a 6-digit code issued before a storm stays exposed to it for at most
  the rest of its ``CODE_TTL`` (on the mesh, where a node id is whatever a sender claims,
  per-account limits bound little: the long codes are the protection there).
- A code redeemed on the transport that issued it does nothing (it must prove the *other*
  account) and is not spent.
- A code sent by a sender the transport did not authenticate is refused and spent (``burn``):
  a forged packet cannot link, and cannot leave the code to be tried again (``bot.trust``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

from bot.domain import DM_SPACE, ConversationKey
from bot.memory.port_identity import CodeStore

CODE_TTL = 600.0
MAX_ATTEMPTS = 5  # failures per account per CODE_TTL
MAX_FAILURES = 30  # failures of all accounts together per CODE_TTL: then codes get long
DIGITS = 6
LONG_DIGITS = 10


def code_hash(code: str) -> str:
    return hashlib.sha256(f"meshsage-link:{code.strip()}".encode()).hexdigest()


class LinkCodes:
    def __init__(self, store: CodeStore, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def issue(self, transport: str, person: str) -> str:
        now = self._clock()
        total, _ = await self._store.link_failures(since=now - CODE_TTL)
        digits = LONG_DIGITS if total >= MAX_FAILURES else DIGITS
        while True:
            code = f"{secrets.randbelow(10**digits):0{digits}d}"
            if await self._store.save_link_code(
                code_hash(code), transport, person, expires_at=now + CODE_TTL, now=now
            ):
                return code

    async def allowed(self, transport: str, person: str) -> bool:
        """False while this account used up its failures (other accounts' never count)."""
        _, per = await self._store.link_failures(since=self._clock() - CODE_TTL)
        return per.get((transport, person), 0) < MAX_ATTEMPTS

    async def redeem(self, code: str, transport: str, person: str) -> ConversationKey | None:
        """The issuing DM for a live code from another transport (the code is then spent);
        None (and one failure counted) otherwise."""
        now = self._clock()
        found = None
        if code.strip().isdigit() and len(code.strip()) in (DIGITS, LONG_DIGITS):
            found = await self._store.take_link_code(code_hash(code), transport=transport, now=now)
        if found is None:
            await self._store.note_link_failure(transport, person, now=now)
            return None
        return ConversationKey(found[0], found[1], DM_SPACE)

    async def burn(self, code: str, transport: str) -> bool:
        """Spend a live code without linking (its sender was not authenticated); True when
        there was one to spend."""
        if not code.strip().isdigit():
            return False
        taken = await self._store.take_link_code(
            code_hash(code), transport=transport, now=self._clock()
        )
        return taken is not None
