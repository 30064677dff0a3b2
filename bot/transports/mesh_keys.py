"""Who sent a mesh packet: the PKI key a DM arrived with, checked against the key pinned for
its node (trust on first use). Pure logic and one small port; no meshtastic import.

A packet's ``from`` is whatever its sender wrote: anyone holding the channel key (the default
LongFast key is public) can claim any node id. Since firmware 2.5 a DM between two nodes that
know each other's keys is PKI-encrypted, and the packet reaches the client with
``pkiEncrypted`` set and the sender's ``publicKey`` (``MessageToDict`` of the MeshPacket
fields ``pki_encrypted``/``public_key``; bytes as base64). Only that names the sender.

Invariants:
- A channel packet is never authenticated and never refused here: channels carry no PKI.
- A DM is ``AUTHENTICATED`` only when it arrived PKI-encrypted with a 32-byte key equal to the
  one pinned for its node id; the first PKI DM from an id with no pin pins its key
  (``KeyPins.pin_first``: an earlier pin, made by another gateway a moment before, wins).
- A DM for an id with a pinned key that arrives with another key (``KEY_CHANGED``) or without
  PKI (``NO_PKI``) is not that person: the transport refuses it (a short notice to the
  packet's node, a WARNING naming the node and the reason, never the text) and counts it.
- A DM without PKI for an id with no pin is ``UNVERIFIED``: answered under ``bot.trust``.
- Without a pin port (a transport used on its own) nothing is authenticated.
- ``Admission`` tells the transport to notify a refused packet's node at most once per
  ``REFUSAL_NOTICE_SECONDS`` per node id: a flood of forged packets earns one packet back.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from bot.domain import Inbound
from bot.transports.mesh_rules import Cooldown

log = logging.getLogger("bot.transport.meshtastic")

PUBLIC_KEY_BYTES = 32  # Curve25519, as the firmware sends it
REFUSAL_NOTICE_SECONDS = 600.0  # one "not that person" notice per node id in this time
REFUSED = ("This DM did not come with the radio key I know for this node, so I did not act on "
           "it. Reset or replaced your radio? Ask the operator to re-pin it.")  # fmt: skip


class Identity(enum.Enum):
    AUTHENTICATED = "authenticated"  # PKI with the pinned key (or its first pin)
    UNVERIFIED = "unverified"  # no PKI, no key pinned: an unauthenticated sender
    KEY_CHANGED = "key_changed"  # PKI with a key other than the pinned one: refused
    NO_PKI = "no_pki"  # no PKI from an id with a pinned key: refused

    @property
    def refused(self) -> bool:
        return self in (Identity.KEY_CHANGED, Identity.NO_PKI)


class KeyPins(Protocol):
    """What the transport needs to know who speaks (``bot.identity.PinnedKeys`` implements it
    over the store; app.py wires it)."""

    async def pinned(self, node: str) -> bytes | None: ...

    async def pin_first(self, node: str, key: bytes) -> bytes: ...

    def refused(self, node: str, identity: Identity) -> None: ...


@runtime_checkable
class Identifies(Protocol):
    """A transport that asks its ``admission`` who speaks (app.py wires the pins)."""

    admission: Admission


def packet_key(packet: Mapping[str, Any]) -> bytes | None:
    """The sender's public key when the packet arrived PKI-encrypted, else None."""
    if not packet.get("pkiEncrypted"):
        return None
    raw = packet.get("publicKey")
    if isinstance(raw, str):
        try:
            raw = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            return None
    if not isinstance(raw, bytes | bytearray) or len(raw) != PUBLIC_KEY_BYTES:
        return None
    return bytes(raw)


def fingerprint(key: bytes) -> str:
    """A short, stable name for a key to show the operator (never the key's use)."""
    return hashlib.sha256(key).hexdigest()[:16]


async def identify(pins: KeyPins | None, node: str, key: bytes | None, *, dm: bool) -> Identity:
    """What a packet from ``node`` proves (see the module docstring)."""
    if not dm or pins is None:
        return Identity.UNVERIFIED
    held = await pins.pinned(node)
    if key is None:
        return Identity.UNVERIFIED if held is None else Identity.NO_PKI
    if held is None:
        held = await pins.pin_first(node, key)
    return Identity.AUTHENTICATED if held == key else Identity.KEY_CHANGED


class Admission:
    """Who speaks, DM by DM, for one transport (see the module docstring)."""

    def __init__(self) -> None:
        self.pins: KeyPins | None = None  # app.py wires the store's (bot.identity)
        self._told = Cooldown(seconds=REFUSAL_NOTICE_SECONDS)

    async def admit(
        self, inbound: Inbound, key: bytes | None, *, now: float
    ) -> tuple[Inbound | None, bool]:
        """The message as the responder gets it (None: refused, not that person), and whether
        to tell the packet's node so (``REFUSED``)."""
        who = await identify(self.pins, inbound.sender, key, dm=inbound.is_dm)
        if not who.refused:
            return replace(inbound, authenticated=who is Identity.AUTHENTICATED), False
        why = "another public key" if who is Identity.KEY_CHANGED else "no PKI"
        log.warning(
            "refused a DM claiming to be %s: it came with %s, not the key pinned for that node "
            "(a forged sender, or a reset radio: `meshsage pins --repin %s` if the owner "
            "confirms)", inbound.sender, why, inbound.sender,
        )  # fmt: skip
        assert self.pins is not None  # refusals need a pin
        self.pins.refused(inbound.sender, who)
        if now < self._told.ready_at(inbound.sender):
            return None, False
        self._told.note(inbound.sender, now)
        return None, True
