"""A fake Bluetooth LE Meshtastic node at bleak's seam, for the unmodified ``BLEInterface``.

``install(monkeypatch, radio)`` replaces the two bleak names ``meshtastic.ble_interface``
uses (``BleakScanner``, ``BleakClient``) with fakes; everything above them (``BLEClient`` and
its event-loop thread, ``BLEInterface``'s scan, connect, receive thread and writes,
``MeshInterface``) runs unmodified. The node speaks Meshtastic's GATT protocol:

- a scan (``BleakScanner.discover``) returns ``{address: (device, advertisement)}`` for each
  advertising node; a node holding a client does not advertise (one BLE client at a time);
- a write to TORADIO is one ToRadio protobuf, handled by the fake radio of ``fake_radio``
  (config, texts, ACKs, probes; on-air bookkeeping and checks as for TCP and serial);
- each FromRadio the node has goes into a queue; a read of FROMRADIO returns the next one,
  or empty bytes once drained; FROMNUM notifies (on the client's event loop, as bleak does)
  when new data is queued;
- ``paired = False``: the node refuses writes as BlueZ does for an unbonded peer
  (``org.bluez.Error.AuthenticationFailed``); ``adapter = False``: bleak finds no adapter;
- ``drop()``: the link is lost (out of range): reads and writes fail with "Not connected" and
  bleak's ``disconnected_callback`` runs on the client's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from bleak.exc import BleakBluetoothNotAvailableError, BleakDBusError, BleakError
from bleak.exc import BleakBluetoothNotAvailableReason as Reason
from meshtastic import ble_interface
from meshtastic.protobuf import mesh_pb2

from tests.fakes.fake_radio import START1, START2, _Clock, _Radio

ADDRESS = "F0:9E:9E:12:AB:CD"
NAME = "Meshtastic_abcd"


@dataclass(frozen=True)
class FakeDevice:
    address: str
    name: str


@dataclass(frozen=True)
class FakeAdvertisement:
    service_uuids: list[str] = field(default_factory=lambda: [ble_interface.SERVICE_UUID])


class FakeBleRadio(_Radio):
    """A node with BLE on; ``client`` is the one bleak client connected to it, if any."""

    def __init__(self, *, clock: _Clock | None = None) -> None:
        super().__init__(clock=clock)
        self.address, self.name = ADDRESS, NAME
        self.advertising = True
        self.paired = True
        self.adapter = True  # the machine's Bluetooth adapter (False: none plugged in)
        self.client: FakeBleakClient | None = None
        self.clients = 0  # bleak clients that ever connected
        self.fromradio: deque[bytes] = deque()

    def _write(self, data: bytes) -> None:  # unused: ``send`` queues whole FromRadios
        raise AssertionError("BLE carries no stream frames")

    def _readable(self) -> bool:
        return False  # a write is handled before write_gatt_char returns

    def send(self, fr: mesh_pb2.FromRadio) -> None:
        with self._lock:
            self.fromradio.append(bytes(fr.SerializeToString()))
            client = self.client
        if client is not None:
            client.notify_fromnum(len(self.fromradio))

    def toradio(self, data: bytes) -> None:
        with self._lock:
            self._feed(bytes([START1, START2, len(data) >> 8, len(data) & 0xFF]) + data)

    def drop(self) -> None:
        """The link is lost (the node went out of range or rebooted)."""
        client = self.client
        if client is not None:
            client.lost()


class FakeBleakClient:
    radio: FakeBleRadio  # set by ``install``

    def __init__(
        self, address: str, disconnected_callback: Callable[[Any], None] | None = None
    ) -> None:
        self.address = address
        self._on_disconnect = disconnected_callback
        self.is_connected = False
        self._notify: dict[str, Callable[..., Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.services = self  # ``services.get_characteristic``
        self._tasks: set[asyncio.Future[Any]] = set()

    def get_characteristic(self, uuid: str) -> str | None:
        known = (ble_interface.TORADIO_UUID, ble_interface.FROMRADIO_UUID,
                 ble_interface.FROMNUM_UUID, ble_interface.LOGRADIO_UUID)  # fmt: skip
        return uuid if uuid in known else None

    async def connect(self, **_: Any) -> bool:
        radio = self.radio
        if self.address != radio.address or not radio.advertising:
            raise BleakError(f"Device with address {self.address} was not found.")
        self._loop = asyncio.get_running_loop()
        with radio._lock:
            radio.client, radio.advertising, radio.fromradio = self, False, deque()
            radio.clients += 1
            radio.connections += 1
        self.is_connected = True
        return True

    async def disconnect(self) -> bool:
        self._release()
        return True

    async def pair(self, **_: Any) -> bool:
        return self.radio.paired

    async def start_notify(self, uuid: str, callback: Callable[..., Any], **_: Any) -> None:
        self._check()
        self._notify[uuid] = callback

    async def read_gatt_char(self, uuid: str, **_: Any) -> bytearray:
        self._check()
        assert uuid == ble_interface.FROMRADIO_UUID
        with self.radio._lock:
            return bytearray(self.radio.fromradio.popleft() if self.radio.fromradio else b"")

    async def write_gatt_char(self, uuid: str, data: bytes, response: bool = False) -> None:
        self._check()
        assert uuid == ble_interface.TORADIO_UUID and response
        if not self.radio.paired:
            raise BleakDBusError("org.bluez.Error.AuthenticationFailed", ["Authentication Failed"])
        self.radio.toradio(bytes(data))

    # --- the node's side ------------------------------------------------------------------
    def notify_fromnum(self, n: int) -> None:
        callback, loop = self._notify.get(ble_interface.FROMNUM_UUID), self._loop
        if callback is None or loop is None or not self.is_connected:
            return

        def run() -> None:
            result = callback(ble_interface.FROMNUM_UUID, bytearray(struct.pack("<I", n)))
            if inspect.isawaitable(result):  # an async handler (the library's log ones)
                task = asyncio.ensure_future(result)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        with contextlib.suppress(RuntimeError):  # the client's loop already closed
            loop.call_soon_threadsafe(run)

    def lost(self) -> None:
        loop, callback = self._loop, self._on_disconnect
        self._release()
        if loop is not None and callback is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(callback, self)

    def _release(self) -> None:
        radio = self.radio
        with radio._lock:
            if radio.client is self:
                radio.client, radio.advertising = None, True
        self.is_connected = False

    def _check(self) -> None:
        if not self.is_connected:
            raise BleakError("Not connected")


class FakeBleakScanner:
    radio: FakeBleRadio  # set by ``install``

    @classmethod
    async def discover(
        cls, timeout: float = 5.0, return_adv: bool = False, **_: Any
    ) -> dict[str, tuple[FakeDevice, FakeAdvertisement]]:
        radio = cls.radio
        if not radio.adapter:
            raise BleakBluetoothNotAvailableError(
                "No Bluetooth adapters found.", Reason.NO_BLUETOOTH
            )
        await asyncio.sleep(0)
        if not radio.advertising:
            return {}
        return {radio.address: (FakeDevice(radio.address, radio.name), FakeAdvertisement())}


def install(monkeypatch: pytest.MonkeyPatch, radio: FakeBleRadio) -> None:
    """Point ``meshtastic.ble_interface``'s bleak names at ``radio``."""
    client = type("Client", (FakeBleakClient,), {"radio": radio})
    scanner = type("Scanner", (FakeBleakScanner,), {"radio": radio})
    monkeypatch.setattr(ble_interface, "BleakClient", client)
    monkeypatch.setattr(ble_interface, "BleakScanner", scanner)
