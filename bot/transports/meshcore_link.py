"""The MeshCore companion link: the official ``meshcore`` library behind a small typed port.

Only ``transports/meshcore*.py`` import ``meshcore``. ``open_companion`` connects over serial,
TCP or BLE (``MeshCore.create_*``) and returns a ``Companion``; the transport speaks only to
that object, so its own code never touches the library's events.

Facts of the library (2.3.x) this module works around:
- ``commands.send`` waits for the first event of the expected *types*, whoever caused it: two
  commands in flight at once would take each other's answers (two ``send_msg`` both see the
  first ``MSG_SENT``; an ``ERROR`` answers everyone waiting). Every command here therefore runs
  under one lock, one at a time.
- A command that gets no answer returns an ``ERROR`` event whose reason is
  ``no_event_received``/``timeout``; ``CompanionTimeout`` is raised for it (the companion may
  be hung), ``CompanionRefused`` for an error the firmware answered (with its code's name).
- Messages wait in the companion until fetched: ``MESSAGES_WAITING`` is pushed when one
  arrives, and ``get_msg`` (``SYNC_NEXT_MESSAGE``) returns them one by one until
  ``NO_MORE_MSGS``. ``next_message`` is that one step.
- ``send_msg`` returns ``MSG_SENT`` with the ``expected_ack`` code (4 bytes: the sha256 of
  timestamp, attempt and text with our key, which the recipient computes and sends back) and
  the firmware's ``suggested_timeout`` in milliseconds; the ACK arrives later as a push.

Invariants:
- Callbacks given to ``Companion`` (``on_waiting``, ``on_ack``, ``on_lost``, ``on_advert``,
  ``on_full``) run on the event loop and must not block.
- ``close`` never raises and is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.config_meshcore import MeshCoreConfig
from bot.errors import TransportError

log = logging.getLogger("bot.transport.meshcore")

NO_ANSWER = frozenset({"no_event_received", "timeout"})


class CompanionTimeout(TransportError):
    """The companion did not answer a command in time (hung firmware or a dead link)."""


class CompanionRefused(TransportError):
    """The companion answered with an error (``code``: ``ERR_CODE_NOT_FOUND``, ...)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Sent:
    expected_ack: str  # hex
    timeout: float  # seconds the firmware suggests waiting for the ACK
    flood: bool  # sent by flood (no known path) rather than along a path


@dataclass(frozen=True)
class SelfInfo:
    name: str
    public_key: str
    sf: int
    bw_khz: float
    cr: int
    freq_mhz: float
    tx_power: int
    manual_add_contacts: bool


def _self_info(raw: dict[str, Any]) -> SelfInfo:
    return SelfInfo(
        name=str(raw.get("name", "")),
        public_key=str(raw.get("public_key", "")),
        sf=int(raw.get("radio_sf", 11) or 11),
        bw_khz=float(raw.get("radio_bw", 250.0) or 250.0),
        cr=int(raw.get("radio_cr", 5) or 5),
        freq_mhz=float(raw.get("radio_freq", 0.0) or 0.0),
        tx_power=int(raw.get("tx_power", 0) or 0),
        manual_add_contacts=bool(raw.get("manual_add_contacts", False)),
    )


class Companion:
    """One open link to a companion radio (see the module docstring)."""

    def __init__(self, mc: Any, *, call_timeout: float) -> None:
        from meshcore import EventType

        self._mc = mc
        self._types = EventType
        self._timeout = call_timeout
        self._lock = asyncio.Lock()
        self._subs: list[Any] = []
        self._closed = False
        self.info = _self_info(dict(mc.self_info or {}))
        self.on_waiting: Callable[[], None] | None = None
        self.on_ack: Callable[[str], None] | None = None
        self.on_lost: Callable[[str], None] | None = None
        self.on_advert: Callable[[dict[str, Any]], None] | None = None
        self.on_full: Callable[[], None] | None = None
        for kind, handler in (
            (EventType.MESSAGES_WAITING, self._waiting),
            (EventType.ACK, self._ack),
            (EventType.DISCONNECTED, self._lost),
            (EventType.NEW_CONTACT, self._advert),
            (EventType.CONTACTS_FULL, self._full),
        ):
            self._subs.append(mc.subscribe(kind, handler))

    # --- pushes -------------------------------------------------------------------------------
    def _waiting(self, event: Any) -> None:
        if self.on_waiting is not None:
            self.on_waiting()

    def _ack(self, event: Any) -> None:
        code = event.payload.get("code") if isinstance(event.payload, dict) else None
        if isinstance(code, str) and self.on_ack is not None:
            self.on_ack(code)

    def _lost(self, event: Any) -> None:
        reason = event.payload.get("reason") if isinstance(event.payload, dict) else None
        if self.on_lost is not None and not self._closed:
            self.on_lost(str(reason or "disconnected"))

    def _advert(self, event: Any) -> None:
        if isinstance(event.payload, dict) and self.on_advert is not None:
            self.on_advert(dict(event.payload))

    def _full(self, event: Any) -> None:
        if self.on_full is not None:
            self.on_full()

    # --- commands (one at a time) -----------------------------------------------------------
    async def _call(self, what: str, factory: Callable[[], Any]) -> Any:
        async with self._lock:
            if self._closed:
                raise TransportError("the companion link is closed")
            try:
                event = await asyncio.wait_for(factory(), self._timeout + 1.0)
            except TimeoutError:
                raise CompanionTimeout(f"the companion did not answer {what}") from None
        if event is None:
            raise CompanionTimeout(f"the companion did not answer {what}")
        if event.type == self._types.ERROR:
            payload = event.payload if isinstance(event.payload, dict) else {}
            if payload.get("reason") in NO_ANSWER:
                raise CompanionTimeout(f"the companion did not answer {what}")
            code = str(payload.get("code_string") or payload.get("error_code") or "unknown")
            raise CompanionRefused(f"the companion refused {what} ({code})", code=code)
        return event

    async def next_message(self) -> tuple[str, dict[str, Any]] | None:
        """One waiting message as ("dm" | "channel", payload), or None when none waits."""
        event = await self._call("a message fetch", lambda: self._mc.commands.get_msg())
        if event.type == self._types.NO_MORE_MSGS:
            return None
        payload = dict(event.payload) if isinstance(event.payload, dict) else {}
        if event.type == self._types.CONTACT_MSG_RECV:
            return "dm", payload
        if event.type == self._types.CHANNEL_MSG_RECV:
            return "channel", payload
        return "other", payload

    async def send_dm(self, prefix: str, text: str, *, timestamp: int, attempt: int) -> Sent:
        event = await self._call(
            "a DM",
            lambda: self._mc.commands.send_msg(prefix, text, timestamp, attempt=attempt),
        )
        p = event.payload
        return Sent(
            expected_ack=bytes(p["expected_ack"]).hex(),
            timeout=float(p.get("suggested_timeout", 0)) / 1000.0,
            flood=p.get("type") == 1,
        )

    async def send_channel(self, index: int, text: str, *, timestamp: int) -> None:
        await self._call(
            "a channel text", lambda: self._mc.commands.send_chan_msg(index, text, timestamp)
        )

    async def refresh_contacts(self) -> dict[str, dict[str, Any]]:
        """The companion's contact table (public key hex -> the library's contact dict)."""
        await self._call("the contact list", lambda: self._mc.commands.get_contacts())
        return dict(self._mc.contacts)

    def contacts(self) -> dict[str, dict[str, Any]]:
        return dict(self._mc.contacts)

    async def add_contact(self, contact: dict[str, Any]) -> None:
        await self._call("adding a contact", lambda: self._mc.commands.add_contact(contact))
        self._mc.contacts[contact["public_key"]] = contact

    async def reset_path(self, key: str) -> None:
        await self._call("a path reset", lambda: self._mc.commands.reset_path(key))

    async def radio_stats(self) -> dict[str, Any] | None:
        """Airtime counters (``tx_air_secs``, ``rx_air_secs``, ``noise_floor``...); None when
        the firmware has no statistics command (older than 1.9)."""
        try:
            event = await self._call("a stats request", lambda: self._mc.commands.get_stats_radio())
        except CompanionRefused:
            return None
        return dict(event.payload) if isinstance(event.payload, dict) else None

    async def device_time(self) -> int:
        event = await self._call("a time request", lambda: self._mc.commands.get_time())
        return int(event.payload.get("time", 0))

    async def device_info(self) -> dict[str, Any]:
        """Firmware version, build and model (``DEVICE_QUERY``)."""
        event = await self._call("a device query", lambda: self._mc.commands.send_device_query())
        return dict(event.payload) if isinstance(event.payload, dict) else {}

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            with contextlib.suppress(Exception):
                self._mc.unsubscribe(sub)
        with contextlib.suppress(Exception):  # closing: the link may already be gone
            await asyncio.wait_for(self._mc.disconnect(), 5.0)


async def open_companion(config: MeshCoreConfig) -> Companion:
    """Connect and start the companion session (``APP_START``); raises ``TransportError``
    with what to check when it cannot."""
    try:
        from meshcore import MeshCore
    except ImportError as exc:
        raise TransportError(
            "the meshcore: section needs the meshcore library. Fix: "
            "pip install 'meshsage[meshcore]' (or remove the meshcore: section)."
        ) from exc
    timeout = config.call_timeout
    try:
        if config.connection == "tcp":
            assert config.host is not None
            coro = MeshCore.create_tcp(config.host, config.port, default_timeout=timeout)
        elif config.connection == "ble":
            coro = MeshCore.create_ble(
                address=config.address, pin=config.ble_pin, default_timeout=timeout
            )
        else:
            assert config.device is not None
            coro = MeshCore.create_serial(config.device, config.baudrate, default_timeout=timeout)
        mc = await asyncio.wait_for(coro, config.connect_timeout)
    except TimeoutError:
        raise TransportError(
            f"no answer from the companion at {config.where()} within "
            f"{config.connect_timeout:.0f} s. Fix: check it is powered and runs companion "
            "firmware (not repeater or room server)"
        ) from None
    except (OSError, ConnectionError) as exc:
        raise TransportError(f"cannot open {config.where()}: {exc}") from None
    if mc is None:
        raise TransportError(
            f"the device at {config.where()} did not start a companion session. Fix: flash "
            "MeshCore companion firmware (USB serial, WiFi or BLE build to match connection:)"
        )
    return Companion(mc, call_timeout=timeout)
