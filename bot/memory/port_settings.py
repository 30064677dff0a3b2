"""The settings port: per-chat settings (``!model``, ``!persona``) kept in the store, so every
gateway on it sees them (``bot.memory.core.settings``; ``bot.chat_settings`` decides).

Invariants every implementation keeps:
- ``set_chat_setting`` sets one field ("model" or "persona") of a scope, None unsetting it;
  any other field is a ``ValueError``. ``done=`` marks a held command done in the same
  transaction.
- ``chat_settings(None)`` lists every scope, ``chat_settings([])`` none, ordered by scope.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bot.memory.records import ChatSetting


class Settings(Protocol):
    """Chat settings by scope."""

    async def chat_settings(self, scopes: Sequence[str] | None = None) -> list[ChatSetting]: ...

    async def set_chat_setting(
        self, scope: str, field: str, value: str | None, *, done: int | None = None
    ) -> None: ...
