"""Model and persona per scope (``chat_settings``), for both backends.

Invariants:
- A scope is a plain string: a channel (``discord:guild:1:ch:2``), a guild
  (``discord:guild:1``), a transport (``meshtastic``) or the whole bot (``*``); the most
  specific scope with a value wins (``bot.chat_settings.resolve``).
- ``set_chat_setting`` changes one field and keeps the other; a row with neither is deleted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bot.memory.core.db import CoreBase
from bot.memory.records import ChatSetting


class SettingsMixin(CoreBase):
    async def chat_settings(self, scopes: Sequence[str] | None = None) -> list[ChatSetting]:
        """The settings of ``scopes`` (None: every scope)."""
        if scopes is None:
            rows = await self._all("SELECT scope, model, persona FROM chat_settings ORDER BY scope")
        elif not scopes:
            return []
        else:
            marks = ", ".join("?" for _ in scopes)
            rows = await self._all(
                f"SELECT scope, model, persona FROM chat_settings WHERE scope IN ({marks}) "
                "ORDER BY scope",
                tuple(scopes),
            )
        return [ChatSetting(str(r[0]), r[1], r[2]) for r in rows]

    async def set_chat_setting(
        self, scope: str, field: str, value: str | None, *, done: int | None = None
    ) -> None:
        """Set ``field`` ("model" or "persona") of ``scope`` to ``value`` (None: unset)."""
        if field not in ("model", "persona"):
            raise ValueError(f"not a chat setting: {field!r}")
        async with self._atomic() as tx:
            row = await tx.one("SELECT model, persona FROM chat_settings WHERE scope = ?", (scope,))
            model, persona = (row[0], row[1]) if row is not None else (None, None)
            if field == "model":
                model = value
            else:
                persona = value
            await tx.exec("DELETE FROM chat_settings WHERE scope = ?", (scope,))
            if model is not None or persona is not None:
                await tx.exec(
                    "INSERT INTO chat_settings (scope, model, persona, updated_at) "
                    "VALUES (?, ?, ?, ?)",
                    (scope, model, persona, time.time()),
                )
            await self._command_done(tx, done)
