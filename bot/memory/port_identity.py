"""The identity ports: who is who across transports. Linked DMs and incognito stretches
(``Identities``), link codes (``CodeStore``, what ``bot.memory.links`` needs) and mesh key pins
(``PinStore``, what ``bot.identity`` needs); ``bot.memory.core.identity`` implements them for
both backends.

Invariants every implementation keeps:
- ``link_dm`` moves one DM conversation's rows into another and marks them with their origin;
  ``unlink_dm`` moves exactly those back. Channel spaces never link.
- Incognito: ``set_incognito`` and ``end_incognito`` (``!incognito``, ``!reset``, ``!forget``)
  give the conversation (and those linked with it) a new stretch id, or none when off;
  ``incognito_stretch`` reads it, so every gateway sees a stretch end (bot.memory.stretch).
- ``pin_key`` pins a person's public key only where none is pinned (unless ``replace``) and
  returns the key pinned now, so two gateways pinning at once agree (bot.transports.mesh_keys).
- ``take_link_code`` spends a live code once: of two gateways redeeming it at once, one gets
  it, the other None.
"""

from __future__ import annotations

from typing import Protocol

from bot.domain import ConversationKey
from bot.memory.records import KeyPin


class PinStore(Protocol):
    """Mesh public keys pinned per person, shared by every gateway on the store."""

    async def key_pin(self, transport: str, person: str) -> KeyPin | None: ...

    async def pin_key(
        self,
        transport: str,
        person: str,
        key: bytes,
        *,
        replace: bool = False,
        pinned_at: float | None = None,
    ) -> bytes: ...

    async def unpin_key(self, transport: str, person: str) -> bool: ...

    async def key_pins(self) -> list[KeyPin]: ...


class CodeStore(Protocol):
    """What link codes need from the memory store (``bot.memory.links`` decides)."""

    async def save_link_code(
        self, code_hash: str, transport: str, person: str, *, expires_at: float, now: float
    ) -> bool: ...

    async def take_link_code(
        self, code_hash: str, *, transport: str, now: float
    ) -> tuple[str, str] | None: ...

    async def note_link_failure(self, transport: str, person: str, *, now: float) -> None: ...

    async def link_failures(self, *, since: float) -> tuple[int, dict[tuple[str, str], int]]: ...


class Identities(PinStore, CodeStore, Protocol):
    """Linked DMs and incognito stretches, with the key pins and link codes."""

    async def link_dm(
        self, home: ConversationKey, other: ConversationKey, *, done: int | None = None
    ) -> int: ...

    async def unlink_dm(self, key: ConversationKey, *, done: int | None = None) -> int | None: ...

    async def set_incognito(self, conversation_id: int, on: bool) -> None: ...

    async def is_incognito(self, conversation_id: int) -> bool: ...

    async def incognito_stretch(self, conversation_id: int) -> str | None: ...

    async def end_incognito(self, transport: str, person: str, *, space: str | None) -> int: ...
