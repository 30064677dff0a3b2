"""``meshsage doctor``'s Bluetooth LE check: what a BLE start needs, without touching the link.

It reads what BlueZ already knows (the adapters in sysfs, ``bluetoothctl info ADDRESS``) and
never scans or connects, so it cannot disturb a live link (a node takes one BLE client). Each
failure says the cause and the fix in the same words as the link's log line
(``bot.transports.meshtastic_ble``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

from bot.config import MeshtasticConfig
from bot.ops.doctor import Check, Level
from bot.transports.meshtastic_ble import MAC, PAIRING, address_problem

SYS_BLUETOOTH = Path("/sys/class/bluetooth")
INFO_TIMEOUT = 5.0


async def check_ble(
    cfg: MeshtasticConfig,
    *,
    sysfs: Path = SYS_BLUETOOTH,
    which: Callable[[str], str | None] = shutil.which,
) -> Check:
    address = cfg.address or ""
    wrong = address_problem(cfg.address)
    if wrong is not None:
        return Check("radio", Level.FAIL, wrong, "correct meshtastic.address in the config")
    adapters = _adapters(sysfs)
    if not adapters:
        return Check("radio", Level.FAIL, f"no Bluetooth adapter (nothing in {sysfs})",
                     "plug one in or turn it on (`rfkill unblock bluetooth`, `bluetoothctl "
                     "power on`); `bluetoothctl list` must show it")  # fmt: skip
    tool = which("bluetoothctl")
    if tool is None:
        return Check("radio", Level.FAIL, "bluetoothctl is missing: BlueZ is not installed",
                     "sudo apt install bluez && sudo systemctl enable --now bluetooth")  # fmt: skip
    if not MAC.fullmatch(address):
        why = "its pairing is not checked (set the MAC address to have it checked)"
        return Check("radio", Level.OK, f"adapter {adapters[0]}; {address!r} is a name, so {why}")
    info = await _info(tool, address)
    fix = PAIRING.format(a=address)
    if info is None:
        return Check("radio", Level.FAIL, "bluetoothctl did not answer (is bluetoothd running?)",
                     "sudo systemctl enable --now bluetooth")  # fmt: skip
    if "Paired: yes" not in info:
        said = "is not paired" if "Paired: no" in info else "is unknown to BlueZ (never paired)"
        return Check("radio", Level.FAIL, f"{address} {said}", fix)
    held = "; connected now (the bot, or another device holding its one connection)"
    return Check("radio", Level.OK, f"adapter {adapters[0]}; {address} is paired"
                 + (held if "Connected: yes" in info else ""))  # fmt: skip


def _adapters(sysfs: Path) -> list[str]:
    """The adapters the kernel has (hci0, ...); sysfs reads do not block."""
    return sorted(p.name for p in sysfs.glob("hci*")) if sysfs.is_dir() else []


async def _info(tool: str, address: str) -> str | None:
    try:
        proc = await asyncio.create_subprocess_exec(
            tool, "info", address, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), INFO_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    return out.decode("utf-8", "replace")
