"""The ``meshcore:`` section: a MeshCore companion radio (transport in bot/transports/meshcore.py).

Kept beside ``config_schema`` (which composes it into ``Config``) so that the MeshCore
transport's settings live in one place; no ``meshcore`` import here.

Invariants:
- Strict and frozen like every section (``config_base._Strict``): unknown keys are errors.
- Channel indexes are the companion's channel slots (0 is the public channel); node keys
  (``ignore_keys``) are hex public keys or prefixes of at least 6 bytes (12 hex digits), the
  length the companion protocol addresses a contact by.
- ``link_problem`` names what is missing to open the link, with the fix.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from bot.config_base import RadioLinkBase

KEY_PREFIX_HEX = 12  # 6 bytes: how the companion protocol addresses a contact
PUBLIC_KEY_HEX = 64  # a MeshCore public key (Ed25519, 32 bytes)
MAX_CHANNEL_SLOTS = 40  # companion firmware keeps up to this many channel slots


def key_text(value: str) -> str:
    """A public key or prefix in lower-case hex (raises ValueError otherwise)."""
    text = value.strip().lower()
    if not re.fullmatch(r"[0-9a-f]+", text) or not (
        KEY_PREFIX_HEX <= len(text) <= PUBLIC_KEY_HEX and len(text) % 2 == 0
    ):
        raise ValueError(
            f"{value!r} must be a MeshCore public key in hex (64 digits) or its first 6+ bytes "
            "(12+ digits), as the app's contact details or `meshcore-cli contacts` show it"
        )
    return text


class MeshCoreConfig(RadioLinkBase):
    """Every key is documented in config.example.yaml and docs/meshcore.md; times are seconds."""

    SECTION = "meshcore"
    HOST_EXAMPLE = "192.168.1.60"

    context_tokens: int = Field(1536, ge=256, le=1_000_000)
    max_tokens: int = Field(100, ge=16, le=4000)
    # link
    baudrate: int = Field(115200, ge=1200, le=4_000_000)
    host: str | None = None  # tcp: a WiFi companion (required for tcp)
    port: int = Field(5000, ge=1, le=65535)
    ble_pin: str | None = Field(None, pattern=r"^[0-9]{6}$")
    connect_timeout: float = Field(20.0, ge=1, le=600)
    call_timeout: float = Field(15.0, ge=0.1, le=600)  # one companion command
    probe_every: float = Field(60.0, ge=0, le=86_400)  # asks the companion; 0 disables
    probe_timeout: float = Field(10.0, gt=0, le=600)  # no answer: hung, reconnect
    # receiving
    channels: tuple[int, ...] = ()  # channel slots where triggers are answered; () = DMs only
    trigger: str | None = Field(None, min_length=1, max_length=40)  # default "@<bot.name>"
    prefix_trigger: bool = True  # a channel message starting with the command prefix triggers
    ignore_names: tuple[str, ...] = ()  # channel senders never answered (other bots)
    ignore_keys: tuple[str, ...] = ()  # DM senders never answered (hex key or 6+ byte prefix)
    dedup_seconds: float = Field(300.0, ge=0, le=86_400)
    channel_cooldown: float = Field(60.0, ge=0, le=86_400)
    auto_add_contacts: bool = True  # add a node the companion heard but did not add itself
    # sending
    max_parts: int = Field(3, ge=1, le=9)
    chunk_bytes: int = Field(158, ge=40, le=158)  # cap; the channel name prefix takes more
    spacing_seconds: float = Field(3.0, ge=1.0, le=120)
    cooldown: float = Field(10.0, ge=0, le=3600)
    ack_timeout: float = Field(30.0, gt=0, le=600)  # at least; the companion suggests one too
    ack_retries: int = Field(2, ge=0, le=10)
    ack_backoff: float = Field(10.0, ge=0, le=600)  # before the first re-send; doubles
    flood_after: int = Field(1, ge=0, le=10)  # re-sends after which a DM path is reset
    duty_cycle: float = Field(10.0, gt=0, le=100)
    busy_threshold: float = Field(20.0, gt=0, le=100)  # channel airtime % (radio stats)
    busy_poll: float = Field(10.0, gt=0, le=600)
    outbox_limit: int = Field(20, ge=1, le=1000)
    queue_wait: float = Field(600.0, gt=0, le=86_400)

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        for ch in v:
            if not 0 <= ch < MAX_CHANNEL_SLOTS:
                raise ValueError(
                    f"channel slot {ch} must be 0-{MAX_CHANNEL_SLOTS - 1} (0 is the public one)"
                )
        return tuple(sorted(set(v)))

    @field_validator("ignore_keys")
    @classmethod
    def _keys(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(key_text(k) for k in v)

    @field_validator("ignore_names")
    @classmethod
    def _names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n.strip() for n in v if n.strip())

    def where(self) -> str:
        """The link in a few words (logs, doctor)."""
        if self.connection == "tcp":
            return f"tcp {self.host}:{self.port}"
        if self.connection == "ble":
            return f"ble {self.address}"
        return f"serial {self.device}"
