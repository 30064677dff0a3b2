"""Doctor's MeshCore checks: the port, then a companion session (its name, firmware, radio).

Invariants:
- Looks only: the session starts (``APP_START``), asks for the device info, and closes; no
  message is sent, no setting or contact changed.
- A serial port is checked like the Meshtastic one first (present, ours to open, a terminal),
  so a missing radio is named before a session times out. A companion the running service
  holds (one USB or TCP client at a time) is a warning that says so, not a failure.
"""

from __future__ import annotations

from bot.config import MeshCoreConfig
from bot.errors import TransportError
from bot.ops.doctor import Check, Level, check_serial


async def check_companion(cfg: MeshCoreConfig) -> list[Check]:
    checks: list[Check] = []
    if cfg.connection == "serial":
        port = check_serial(cfg.device or "")
        port = Check(
            "meshcore port", port.level, port.detail, port.fix.replace("meshtastic.", "meshcore.")
        )
        checks.append(port)
        if port.level is Level.FAIL:
            return [*checks, Check("companion", Level.SKIP, "skipped: the port check failed")]
    from bot.transports.meshcore_link import open_companion

    try:
        companion = await open_companion(cfg)
    except TransportError as exc:
        return [
            *checks,
            Check(
                "companion",
                Level.WARN
                if "cannot open" in str(exc) and cfg.connection == "serial"
                else Level.FAIL,
                str(exc),
                "if the meshsage service is running it holds the link: `systemctl stop meshsage` "
                "and run doctor again",
            ),
        ]
    try:
        info = companion.info
        try:
            device = await companion.device_info()
        except TransportError:
            device = {}
        firmware = (
            " ".join(str(device[k]) for k in ("ver", "fw_build", "model") if device.get(k))
            or "firmware older than the device query"
        )
        adding = (
            "by hand (the bot adds them: auto_add_contacts)"
            if info.manual_add_contacts
            else "automatically"
        )
        detail = (
            f"{cfg.where()}: node {info.name!r} (key {info.public_key[:12]}...), {firmware}; "
            f"radio {info.freq_mhz:.3f} MHz, BW {info.bw_khz:g} kHz, SF{info.sf}, CR 4/{info.cr}, "
            f"{info.tx_power} dBm; contacts added {adding}"
        )
        level, fix = Level.OK, ""
        if info.manual_add_contacts and not cfg.auto_add_contacts:
            level = Level.WARN
            fix = (
                "new nodes cannot DM the bot until added in the app: set "
                "meshcore.auto_add_contacts: true"
            )
        checks.append(Check("companion", level, detail, fix))
    finally:
        await companion.close()
    return checks
