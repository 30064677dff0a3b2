"""The bricks every config section is built from: strict frozen models, per-transport basics.

Invariants: every model forbids unknown keys and is frozen (``_Strict``); each transport
section carries ``enabled``, its durable-outbox ``delivery`` and its token budgets
(``TransportBase``); a radio's link (serial, TCP or BLE, reconnect backoff) is checked one
way for every radio (``RadioLinkBase``). Imports nothing from ``bot`` (both ``config_schema``
and the transport sections kept beside it, such as ``config_meshcore``, build on it).
"""

from __future__ import annotations

from typing import ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


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


class RadioLinkBase(TransportBase):
    """A radio reached over serial, TCP or BLE (Meshtastic, MeshCore): the link keys every radio
    shares, their check, and what is missing to open it. ``SECTION`` names the config section
    in messages; ``HOST_EXAMPLE`` is the address its fix shows."""

    SECTION: ClassVar[str] = "radio"
    HOST_EXAMPLE: ClassVar[str] = "192.168.1.50"

    connection: Literal["serial", "tcp", "ble"] = "serial"
    device: str | None = None  # serial: /dev/serial/by-id/... (required for serial)
    address: str | None = None  # ble: MAC address or device name (required for ble)
    reconnect_initial: float = Field(5.0, gt=0, le=3600)
    reconnect_max: float = Field(300.0, gt=0, le=86_400)

    @model_validator(mode="after")
    def _backoff(self) -> Self:
        if self.reconnect_initial > self.reconnect_max:
            raise ValueError("reconnect_initial must not exceed reconnect_max")
        return self

    def link_problem(self) -> str | None:
        """What is missing to open the radio link (checked when the transport is built)."""
        needed = {"serial": "device", "tcp": "host", "ble": "address"}[self.connection]
        if getattr(self, needed):
            return None
        example = {
            "device": "device: /dev/serial/by-id/usb-...",
            "host": f"host: {self.HOST_EXAMPLE}",
            "address": "address: AA:BB:CC:DD:EE:FF",
        }[needed]
        return f"{self.SECTION}: connection: {self.connection} needs '{needed}'. Fix: add {example}"
