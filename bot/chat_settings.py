"""Model and persona per channel, server, transport, bot or person: which one a turn uses.

Invariants:
- Scopes, most specific first (``scopes_for``): the person's own choice on this transport
  (``discord:person:930...``: only a persona the operator allowed, ``bot.personas``), the
  channel (``discord:guild:1:ch:2``, ``meshtastic:ch:0``; a DM has none), the server
  (``discord:guild:1``), the transport (``discord``), the whole bot (``*``). The first scope
  with a value wins, separately for the model and the persona; none: the config's.
- The settings live in the store (``chat_settings``, both backends) and are cached here:
  loaded at start and rewritten on every change made through this object, so a turn reads no
  extra row. (Another gateway's change is seen after its next ``load``.)
- A persona value is a name from ``bot.personas`` or, set by an operator, the prompt itself;
  it replaces ``bot.system_prompt`` for the conversations in its scope. Memory stays per
  person whatever the persona says: it changes the system prompt only.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.domain import DM_SPACE, Inbound
from bot.memory.port_settings import Settings
from bot.memory.records import ChatSetting

BOT_SCOPE = "*"


def scopes_for(transport: str, space: str, person: str | None = None) -> list[str]:
    """The scopes that apply to a conversation, most specific first."""
    out = [f"{transport}:person:{person}"] if person else []
    if space != DM_SPACE:
        out.append(f"{transport}:{space}")
        parts = space.split(":")
        if len(parts) >= 4 and parts[0] == "guild":
            out.append(f"{transport}:guild:{parts[1]}")
    return [*out, transport, BOT_SCOPE]


class ChatSettings:
    def __init__(self, *, store: Settings, personas: Mapping[str, str]) -> None:
        self._store = store
        self.personas = dict(personas)
        self._rows: dict[str, ChatSetting] = {}

    async def load(self) -> None:
        self._rows = {r.scope: r for r in await self._store.chat_settings()}

    async def set(
        self, scope: str, field: str, value: str | None, *, held: int | None = None
    ) -> None:
        # a held !model/!persona: marked done with the change (a replay tells, never redoes)
        await self._store.set_chat_setting(scope, field, value, done=held)
        self._rows = {r.scope: r for r in await self._store.chat_settings()}

    def _first(self, scopes: list[str], field: str) -> tuple[str | None, str | None]:
        for scope in scopes:
            row = self._rows.get(scope)
            value = None if row is None else getattr(row, field)
            if value is not None:
                return value, scope
        return None, None

    def model(self, inbound: Inbound) -> str | None:
        """The model chosen for this conversation (None: the configured one)."""
        return self._first(scopes_for(inbound.transport, inbound.space, inbound.sender), "model")[0]

    def persona(self, inbound: Inbound) -> tuple[str | None, str | None]:
        """(the persona's name or "custom", its prompt), or (None, None): the configured one."""
        value, _ = self._first(
            scopes_for(inbound.transport, inbound.space, inbound.sender), "persona"
        )
        if value is None:
            return None, None
        if value in self.personas:
            return value, self.personas[value]
        return "custom", value
