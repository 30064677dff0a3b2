"""The bricks every config section is built from: strict frozen models, per-transport basics.

Invariants: every model forbids unknown keys and is frozen (``_Strict``); each transport
section carries ``enabled``, its durable-outbox ``delivery`` and its token budgets
(``TransportBase``). Imports nothing from ``bot`` (both ``config_schema`` and the transport
sections kept beside it, such as ``config_meshcore``, build on it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class DeliveryConfig(_Strict):
    """The durable outbox, per transport: how old an undelivered reply may get before it is
    dropped (marked expired) instead of sent after an outage or restart."""

    max_age: float = Field(3600.0, ge=0, le=30 * 86_400)


class TransportBase(_Strict):
    enabled: bool = True
    delivery: DeliveryConfig = DeliveryConfig()
    context_tokens: int = Field(2048, ge=256, le=1_000_000)
    max_tokens: int = Field(400, ge=16, le=100_000)
