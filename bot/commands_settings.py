"""``!model`` and ``!persona``: the model and the persona (system prompt) per channel, server,
transport-wide bot or person (``bot.chat_settings``), from chat.

Invariants:
- ``!model`` is for operators only (``Commands`` registers it as an operator command); a name
  the LLM server does not offer is refused with the list it offers, and nothing changes when
  the list cannot be read.
- ``!persona NAME`` lets anyone choose, for their own conversations on this transport, one of
  the personas the operator allowed (``bot.personas``), except on the mesh
  (``OPERATORS_ONLY``), where only operators change it; setting a persona for a channel, a
  server or the bot (``here``/``server``/``bot``), or any text as one, is for operators.
- A persona changes the system prompt only: memory stays per person, so no persona can make
  the bot read another person's conversation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bot.chat_settings import BOT_SCOPE, ChatSettings
from bot.domain import DM_SPACE, Inbound

ListModels = Callable[[], Awaitable[list[str]]]
WHERE = ("here", "server", "bot")
OPERATORS_ONLY = ("meshtastic", "meshcore")  # transports where choosing a persona is for operators


def scope_of(inbound: Inbound, where: str) -> str | None:
    """The scope ``where`` names for this conversation (None: no such scope here)."""
    if where == "bot":
        return BOT_SCOPE
    if where == "server":
        parts = inbound.space.split(":")
        if len(parts) >= 4 and parts[0] == "guild":
            return f"{inbound.transport}:guild:{parts[1]}"
        return None
    if inbound.space == DM_SPACE:
        return f"{inbound.transport}:person:{inbound.sender}"
    return f"{inbound.transport}:{inbound.space}"


class SettingsCommands:
    def __init__(
        self,
        *,
        settings: ChatSettings,
        list_models: ListModels | None,
        prefix: str,
        configured_model: Callable[[], str],
        is_operator: Callable[[Inbound], bool],
    ) -> None:
        self._settings = settings
        self._list = list_models
        self._p = prefix
        self._configured = configured_model
        self._is_operator = is_operator

    def model_here(self, inbound: Inbound) -> str:
        return self._settings.model(inbound) or self._configured()

    def persona_here(self, inbound: Inbound) -> str | None:
        return self._settings.persona(inbound)[0]

    async def _models(self) -> list[str] | str:
        if self._list is None:
            return "this LLM server cannot list its models"
        try:
            return await self._list()
        except Exception as exc:
            return f"the LLM server did not list its models ({type(exc).__name__})"

    async def model(self, inbound: Inbound, arg: str, *, held: int | None = None) -> str:
        p = self._p
        words = arg.split()
        usage = f"Usage: {p}model NAME [here|server|bot], {p}model clear [here|server|bot]"
        if not words:
            models = await self._models()
            offered = ", ".join(models) if isinstance(models, list) else models
            return f"Model here: {self.model_here(inbound)}. The server offers: {offered}. {usage}"
        name, where = words[0], (words[1].lower() if len(words) > 1 else "here")
        if len(words) > 2 or where not in WHERE:
            return usage
        scope = scope_of(inbound, where)
        if scope is None:
            return f"There is no server here; use {p}model {name} here or bot."
        if name.lower() == "clear":
            await self._settings.set(scope, "model", None, held=held)
            return f"Model for {where}: back to the default ({self.model_here(inbound)})."
        models = await self._models()
        if isinstance(models, str):
            return f"Not changed: {models}."
        if name not in models:
            return f"The server has no model {name}. It offers: {', '.join(models) or 'none'}."
        await self._settings.set(scope, "model", name, held=held)
        return f"Model for {where}: {name}."

    async def persona(self, inbound: Inbound, arg: str, *, held: int | None = None) -> str:
        p = self._p
        allowed = ", ".join(sorted(self._settings.personas)) or "none"
        words = arg.split(maxsplit=1)
        if not words:
            now = self.persona_here(inbound) or "the default"
            return (f"Persona here: {now}. You may choose: {allowed} ({p}persona NAME, "
                    f"{p}persona off).")  # fmt: skip
        first = words[0].lower()
        operator = self._is_operator(inbound)
        if inbound.transport in OPERATORS_ONLY and not operator:
            return "On the mesh only operators change the persona."
        if first in WHERE or (first == "clear" and operator):
            if not operator:
                return f"Only operators set a persona for {first}. You may choose: {allowed}."
            if first == "clear":
                where = words[1].strip().lower() if len(words) > 1 else "here"
                scope = scope_of(inbound, where) if where in WHERE else None
                if scope is None:
                    return f"Usage: {p}persona clear [here|server|bot]"
                await self._settings.set(scope, "persona", None, held=held)
                return f"Persona for {where}: back to the default."
            scope = scope_of(inbound, first)
            text = words[1].strip() if len(words) > 1 else ""
            if scope is None or not text:
                return f"Usage: {p}persona here|server|bot NAME-or-prompt"
            await self._settings.set(scope, "persona", text, held=held)
            shown = text if text in self._settings.personas else "custom"
            return f"Persona for {first}: {shown}."
        mine = f"{inbound.transport}:person:{inbound.sender}"
        if first == "off":
            await self._settings.set(mine, "persona", None, held=held)
            return "Your persona: back to the default."
        name = arg.strip()
        if name not in self._settings.personas:
            return f"No persona {name}. You may choose: {allowed}."
        await self._settings.set(mine, "persona", name, held=held)
        return f"Your persona: {name} (in your conversations on {inbound.transport})."
