"""Key pins over the store: the ``KeyPins`` port the mesh transport uses to know who speaks,
the operator's view of the pins, and re-pinning (``meshsage pins``, ``!repin``).

Invariants:
- A key pinned in config (``meshtastic.pinned_keys``, e.g. the operators') is the node's key:
  no first PKI DM pins another, and ``repin`` cannot remove it (edit the config instead).
- Otherwise the store holds the pin (``key_pins``), shared by every gateway on the store:
  a pin made through one gateway holds in the other.
- Refusals are counted here (``counts``: status, doctor, /metrics), by reason, since start.
- The operator sees node ids, key fingerprints and pin dates only (``describe``), never a
  message and never a whole key.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping

from bot.config import Config
from bot.errors import ConfigError
from bot.memory.port_identity import PinStore
from bot.transports.mesh_keys import PUBLIC_KEY_BYTES, Identity, fingerprint
from bot.trust import SenderPolicy

log = logging.getLogger("bot.identity")

MESH = "meshtastic"


def policy_for(config: Config) -> SenderPolicy:
    """Who may do what (``bot.trust``), from ``bot.operators`` and
    ``meshtastic.unauthenticated_dm``."""
    mesh = config.meshtastic
    memory = mesh is not None and mesh.unauthenticated_dm == "memory"
    return SenderPolicy(
        operators=frozenset(config.bot.operators),
        memory_transports=frozenset({MESH}) if memory else frozenset(),
    )


def risks(config: Config) -> list[str]:
    """What a careful operator should know about who is trusted on the mesh (check-config,
    run and doctor say it; none stops the bot)."""
    mesh = config.meshtastic
    if mesh is None or MESH not in config.enabled_transports():
        return []
    src = config.source
    found = []
    if mesh.unauthenticated_dm == "memory":
        found.append(
            f"{src}: meshtastic.unauthenticated_dm: memory lets anyone holding the channel key "
            "read and add to the memory of every node without PKI (firmware before 2.5) by "
            "putting its id in a packet's from; its answers go out under the channel key only. "
            "Fix: keep the default (chat) unless you trust everyone who holds the channel key"
        )
    unpinned = sorted(
        op.split(":", 1)[1]
        for op in config.bot.operators
        if op.startswith(f"{MESH}:") and op.split(":", 1)[1] not in mesh.pinned_keys
    )
    if unpinned:
        found.append(
            f"{src}: mesh operator(s) {', '.join(unpinned)} have no meshtastic.pinned_keys "
            "entry: the first PKI DM claiming each id pins its key (trust on first use). Fix: "
            "pin each operator's public key (meshtastic --nodes shows it) to close that window"
        )
    return found


def configured_keys(config: Config) -> dict[str, bytes]:
    mesh = config.meshtastic
    if mesh is None:
        return {}
    return {node: base64.b64decode(key) for node, key in mesh.pinned_keys.items()}


class PinnedKeys:
    """``mesh_keys.KeyPins`` for one transport, over the store and the configured keys."""

    def __init__(
        self, *, store: PinStore, transport: str = MESH, configured: Mapping[str, bytes]
    ) -> None:
        self._store = store
        self._transport = transport
        self._configured = dict(configured)
        self.refusals: Counter[str] = Counter()

    async def pinned(self, node: str) -> bytes | None:
        if node in self._configured:
            return self._configured[node]
        pin = await self._store.key_pin(self._transport, node)
        return None if pin is None else pin.public_key

    async def pin_first(self, node: str, key: bytes) -> bytes:
        if node in self._configured:
            return self._configured[node]
        held = await self._store.pin_key(self._transport, node, key)
        if held == key:
            log.info("pinned the key of %s on first use (%s)", node, fingerprint(key))
        return held

    def refused(self, node: str, identity: Identity) -> None:
        self.refusals[identity.value] += 1

    def counts(self) -> dict[str, int]:
        """Refused DMs since start, by reason (zeros included: a steady metric)."""
        return {f"refused_{i.value}": self.refusals[i.value] for i in Identity if i.refused}

    async def repin(self, node: str, key: bytes | None = None) -> str:
        """Drop the node's pin (its next PKI DM pins anew) or pin ``key`` in its place; the
        operator's answer, in one line."""
        if node in self._configured:
            return (f"{node}'s key is pinned in the config (meshtastic.pinned_keys): edit it "
                    "there and restart.")  # fmt: skip
        if key is not None:
            await self._store.pin_key(self._transport, node, key, replace=True)
            log.warning("operator re-pinned %s to %s", node, fingerprint(key))
            return f"Pinned {node} to key {fingerprint(key)}."
        if not await self._store.unpin_key(self._transport, node):
            return f"No key was pinned for {node}."
        log.warning("operator removed the key pin of %s: its next PKI DM pins anew", node)
        return f"Unpinned {node}: the next PKI DM from it pins its key."

    async def describe(self) -> list[str]:
        """One line per pin: node, fingerprint, since when (or that the config pins it)."""
        lines = [f"{node} {fingerprint(key)} (config)" for node, key in self._configured.items()]
        for pin in await self._store.key_pins():
            if pin.transport != self._transport or pin.person in self._configured:
                continue
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(pin.pinned_at))
            lines.append(f"{pin.person} {fingerprint(pin.public_key)} (pinned {when} UTC)")
        return lines


async def pins_command(
    store: PinStore,
    config: Config,
    *,
    repin: str | None,
    key: str | None,
    out: Callable[[str], None],
) -> int:
    """``meshsage pins``: list the pins, or re-pin one node (exit status)."""
    pins = PinnedKeys(store=store, configured=configured_keys(config))
    if repin is None:
        if key is not None:
            raise ConfigError("--key needs --repin NODE. Fix: meshsage pins --repin !1234abcd "
                              "--key BASE64")  # fmt: skip
        lines = await pins.describe()
        for line in lines or ["no key pinned yet: each node's first PKI DM pins its key"]:
            out(line)
        return 0
    node = repin.strip().lower()
    if not re.fullmatch(r"!?[0-9a-f]{8}", node):
        raise ConfigError(f"{repin!r} is not a node id. Fix: --repin !1234abcd")
    raw = None
    if key is not None:
        try:
            raw = base64.b64decode(key.strip(), validate=True)
        except ValueError:
            raw = b""
        if len(raw) != PUBLIC_KEY_BYTES:
            raise ConfigError(f"--key must be the node's {PUBLIC_KEY_BYTES}-byte public key in "
                              "base64 (`meshtastic --nodes` or the app shows it)")  # fmt: skip
    out(await pins.repin("!" + node.lstrip("!"), raw))
    return 0
