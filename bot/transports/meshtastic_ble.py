"""Why a Bluetooth LE start failed, in the operator's words: the cause and the fix.

The library's BLE errors say little (no D-Bus: "[Errno 2] No such file or directory"; an
unpaired node: "Error writing BLE"; a lowercase address: "not found"). ``ble_failure`` names
the cause (no BlueZ, no adapter, node not seen, not paired) and the fix (``bluetoothctl``
pairing, the address form); the link's log line and ``meshsage doctor`` say the same words.

It also owns the interface class the link builds (``interface_class``): the library's
``BLEInterface`` with one fix. bleak calls its ``disconnected_callback`` on the client's event
loop; the library's callback runs ``close()`` there, which waits on that same loop
(``client.disconnect``) and deadlocks, so a lost BLE link was never reported and the bot
stayed deaf until the stale-link probe. Here a close called on that loop runs on a thread of
its own; everything else is the library's.

Invariants: importing this module imports neither meshtastic nor bleak (doctor uses it); the
library's error is recognised by its class name and ``kind``, never by importing it.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from typing import Any

log = logging.getLogger("bot.transport.meshtastic")

MAC = re.compile(r"[0-9A-F]{2}(:[0-9A-F]{2}){5}")
_MAC_ANY = re.compile(r"[0-9a-fA-F]{2}([:_-]?[0-9a-fA-F]{2}){5}")
PAIRING = (
    "pair it once: `bluetoothctl`, then `scan on`, `pair {a}` (type the PIN the node shows; "
    "123456 on a node without a screen), `trust {a}`; the service's user must be in the "
    "`bluetooth` group (sudo usermod -aG bluetooth meshsage)"
)


def address_problem(address: str | None) -> str | None:
    """What is wrong with ``meshtastic.address`` for BLE, or None (a MAC as BlueZ writes it,
    or a device name)."""
    if not address:
        return "meshtastic.address is not set: set it to the node's Bluetooth address"
    if address.startswith("!"):
        return (f"meshtastic.address {address!r} is a Meshtastic node id, not a Bluetooth "
                "address: write the MAC address `bluetoothctl devices` (or `meshtastic "
                "--ble-scan`) lists, in the form AA:BB:CC:DD:EE:FF")  # fmt: skip
    if _MAC_ANY.fullmatch(address) and not MAC.fullmatch(address):
        return (f"meshtastic.address {address!r} is not in the form BlueZ reports, so no "
                f"scan matches it: write {canonical(address)} (upper case, colons)")  # fmt: skip
    return None


def canonical(address: str) -> str:
    hexes = re.sub(r"[:_-]", "", address).upper()
    return ":".join(hexes[i : i + 2] for i in range(0, 12, 2))


def ble_failure(exc: BaseException, address: str | None) -> str:
    """The cause of a failed BLE start and how to fix it, one sentence each."""
    a = address or "AA:BB:CC:DD:EE:FF"
    name, text = type(exc).__name__, str(exc)
    kind = getattr(exc, "kind", None)
    said = f"({name}: {text})" if text else f"({name})"
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError) or "ServiceUnknown" in text:
        return (f"BLE: BlueZ is not reachable {said}: no D-Bus system bus or no bluetoothd. "
                "Fix: sudo apt install bluez && sudo systemctl enable --now bluetooth; in a "
                "container, mount the host's /run/dbus (docs/meshtastic.md)")  # fmt: skip
    if name == "BleakBluetoothNotAvailableError" or "adapter" in text.lower():
        return (f"BLE: no Bluetooth adapter {said}. Fix: plug one in or turn it on "
                "(`rfkill unblock bluetooth`, `bluetoothctl power on`); `bluetoothctl list` "
                "must show it")  # fmt: skip
    if kind == "device_not_found" or "was not found" in text:
        wrong = address_problem(address)
        if wrong is not None:
            return f"BLE: no node matches {said}: {wrong}"
        return (
            f"BLE: no Meshtastic node {a!r} was seen in a 10 s scan {said}: it is off, out "
            "of range, or another device (a phone app) holds its one BLE connection. Fix: "
            "close the app's connection; `bluetoothctl devices` must list it; set "
            "meshtastic.address to that address (AA:BB:CC:DD:EE:FF) or its exact name"
        )
    if kind == "multiple_devices":
        return (
            f"BLE: several nodes match {a!r} {said}. Fix: set meshtastic.address to one "
            "node's address (AA:BB:CC:DD:EE:FF), as `bluetoothctl devices` lists it"
        )
    if kind in ("write_error", "read_error") or any(
        s in text for s in ("Authentication", "NotPermitted", "NotAuthorized", "Insufficient")
    ):
        return (f"BLE: the node refused to talk {said}: it is not paired with this machine (or "
                f"the pairing is stale: `bluetoothctl remove {a}` first). Fix: "
                + PAIRING.format(a=a))  # fmt: skip
    return (f"BLE start failed {said}. Fix: `bluetoothctl info {a}` must say Paired: yes and "
            "Connected: no (another device holding the node's one BLE connection); "
            + PAIRING.format(a=a))  # fmt: skip


@functools.cache
def interface_class() -> Any:
    """``BLEInterface`` whose close never runs on the BLE client's own event loop."""
    from meshtastic.ble_interface import BLEInterface

    class LinkBLEInterface(BLEInterface):  # type: ignore[misc]
        # Set only at the end of a successful __init__; a half-built interface's close()
        # would stop at its AttributeError before it disconnects, and BlueZ would keep the
        # node's one connection (every later start then fails).
        _exit_handler: Any = None

        def close(self) -> None:
            loop_thread = getattr(getattr(self, "client", None), "_eventThread", None)
            if loop_thread is threading.current_thread():
                # bleak's disconnected callback: free the loop; this thread ends with close.
                threading.Thread(target=self._close_off_loop, name="BLEClose", daemon=True).start()
                return
            super().close()

        def _close_off_loop(self) -> None:
            try:
                super().close()
            except Exception:  # thread boundary: the link is gone either way; say why
                log.warning("closing the lost BLE link failed", exc_info=True)

    return LinkBLEInterface
