"""A fake MeshCore companion radio speaking the companion protocol's frames over TCP.

The unmodified ``meshcore`` library connects to it (``MeshCore.create_tcp``) exactly as to a
WiFi companion: frames host -> radio are ``<`` + length (LE16) + payload, radio -> host ``>``
+ length + payload; payloads are the firmware's (``examples/companion_radio/MyMesh.cpp``):
``APP_START`` -> ``SELF_INFO``, ``DEVICE_QUERY`` -> ``DEVICE_INFO``, ``GET_CONTACTS`` ->
``CONTACT_START``/``CONTACT``.../``CONTACT_END``, ``SYNC_NEXT_MESSAGE`` -> a ``*_MSG_RECV_V3``
or ``NO_MORE_MSGS``, ``SEND_TXT_MSG`` -> ``MSG_SENT`` (the expected ACK computed as the firmware
does: sha256 of timestamp, attempt & 3 and text, with the companion's public key) and later an
``ACK`` push, ``SEND_CHANNEL_TXT_MSG`` -> ``OK``, ``GET_STATS`` (radio) -> ``STATS``; pushes
``MESSAGES_WAITING``, ``PUSH_CODE_NEW_ADVERT``, ``CONTACTS_FULL``.

As unkind as the firmware: a channel text goes on air as ``"<name>: <text>"`` cut at 160 bytes
(mid-character if that is where it falls); a DM over 160 bytes (158 from the fifth attempt) is
refused; a DM from a node that is not a contact cannot be decrypted and never reaches the host;
ACKs are late (``ack_delay`` of the virtual clock) or lost (``lose_acks``); the companion can
hang (``hang()``: reads every command, answers none) or drop the link (``drop()``).

Every packet it puts on air is recorded (``on_air``) with the virtual time; each person's
radio keeps what it showed (``shown``), dropping a packet it already has (same timestamp, text
and attempt, as the firmware's seen-table does: no ACK for it either) so a test can check
"delivered once"; a re-send with a new attempt number is ACKed but not shown again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import struct
from dataclasses import dataclass, field

from bot.transports.meshcore_rules import lora_airtime, packet_bytes
from tests.fakes.fake_clock import FakeClock

MAX_TEXT_LEN = 160


@dataclass
class Person:
    name: str
    key: bytes
    contact: bool = True  # in the companion's contact table
    out_path_len: int = 1  # -1: flood
    lose_acks: int = 0  # the next N DMs to this person get no ACK
    shown: list[str] = field(default_factory=list)
    seen: set[tuple[int, str]] = field(default_factory=set)

    @property
    def prefix(self) -> str:
        return self.key[:6].hex()


@dataclass(frozen=True)
class OnAir:
    at: float
    kind: str  # "dm" or "channel"
    to: str  # a person's name or "ch<N>"
    text: bytes  # what the radio put on air (a channel text with the name prefix)
    attempt: int = 0


def _frame(payload: bytes) -> bytes:
    return b">" + len(payload).to_bytes(2, "little") + payload


class FakeCompanion:
    def __init__(
        self,
        *,
        clock: FakeClock,
        name: str = "meshsage",
        sf: int = 11,
        bw_khz: float = 250.0,
        cr: int = 5,
        manual_add: bool = False,
        ack_delay: float = 4.0,
        suggested_timeout_ms: int = 8000,
    ) -> None:
        self.clock = clock
        self.name = name
        self.key = os.urandom(32)
        self.sf, self.bw, self.cr = sf, bw_khz, cr
        self.manual_add = manual_add
        self.ack_delay = ack_delay
        self.suggested_timeout_ms = suggested_timeout_ms
        self.people: dict[str, Person] = {}
        self.queue: list[bytes] = []
        self.on_air: list[OnAir] = []
        self.commands: list[int] = []
        self.hung = False
        self.lose_replies = 0  # the next N answers to commands are lost on the wire
        self.tx_air = 0.0  # seconds on air of what it sent (its radio counters)
        self.others_share = 0.0  # percent of the time other nodes fill the channel (received)
        self.connections = 0
        self._writer: asyncio.StreamWriter | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._activity = 0
        self.port = 0
        clock.settle_hooks.append(self.busy)

    # --- life -----------------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.drop()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    def busy(self) -> bool:
        """FakeClock settle hook: True when frames moved since the last look."""
        moved, self._activity = self._activity, 0
        return moved > 0

    def hang(self) -> None:
        """Hung firmware: commands are read, none answered, until the next connection."""
        self.hung = True

    def drop(self) -> None:
        """The link breaks (cable pulled, WiFi gone)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # --- the world ------------------------------------------------------------------------------
    def person(self, name: str, *, contact: bool = True) -> Person:
        p = Person(name=name, key=os.urandom(32), contact=contact)
        self.people[p.key.hex()] = p
        return p

    def dm_from(
        self, person: Person, text: str, *, txt_type: int = 0, ts: int | None = None
    ) -> None:
        if not person.contact:
            return  # no key to derive the shared secret: the firmware cannot decrypt it
        stamp = ts if ts is not None else int(self.clock.monotonic())
        body = bytes([40, 0, 0]) + person.key[:6] + bytes([1, txt_type])
        body += stamp.to_bytes(4, "little") + text.encode("utf-8")
        self._push_message(bytes([16]) + body)

    def channel_text(self, index: int, name: str, text: str, *, ts: int | None = None) -> None:
        stamp = ts if ts is not None else int(self.clock.monotonic())
        raw = f"{name}: {text}".encode()[:MAX_TEXT_LEN]
        body = bytes([40, 0, 0, index, 1, 0]) + stamp.to_bytes(4, "little") + raw
        self._push_message(bytes([17]) + body)

    def advert(self, person: Person) -> None:
        """The companion hears a node's advert; with manual adding it only tells the host."""
        if self.manual_add:
            self._send(bytes([0x8A]) + self._contact(person))
        else:
            person.contact = True

    def contacts_full(self) -> None:
        self._send(bytes([0x90]))

    def airtime(self, text_bytes: int, *, dm: bool) -> float:
        size = packet_bytes(text_bytes, dm=dm, name_bytes=len(self.name.encode()))
        return lora_airtime(size, sf=self.sf, bw_khz=self.bw, cr=self.cr)

    def channel_shown(self, index: int) -> list[bytes]:
        return [a.text for a in self.on_air if a.kind == "channel" and a.to == f"ch{index}"]

    def _push_message(self, frame: bytes) -> None:
        self.queue.append(frame)
        self._send(bytes([0x83]))

    # --- the wire -------------------------------------------------------------------------------
    def _send(self, payload: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._activity += 1
            self._writer.write(_frame(payload))

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.drop()
        self._writer = writer
        self.connections += 1
        self.hung = False  # a new session: the firmware was restarted
        try:
            while True:
                head = await reader.readexactly(3)
                if head[0] != 0x3C:
                    continue
                size = int.from_bytes(head[1:], "little")
                payload = await reader.readexactly(size)
                self._activity += 1
                self.commands.append(payload[0])
                if not self.hung:
                    self._command(payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()

    def _answer(self, payload: bytes) -> None:
        """A command's answer, unless the wire loses it (a frame lost on a noisy UART)."""
        if self.lose_replies > 0:
            self.lose_replies -= 1
            return
        self._send(payload)

    def _command(self, p: bytes) -> None:
        cmd = p[0]
        if cmd == 1:
            self._send(self._self_info())
        elif cmd == 22:
            self._send(self._device_info())
        elif cmd == 4:
            self._contacts()
        elif cmd == 10:
            self._send(self.queue.pop(0) if self.queue else bytes([10]))
        elif cmd == 2:
            self._dm(p)
        elif cmd == 3:
            self._channel(p)
        elif cmd == 9:
            key = p[1:33].hex()
            if key in self.people:
                self.people[key].contact = True
            self._send(bytes([0]))
        elif cmd == 13:
            person = self.people.get(p[1:33].hex())
            if person is not None:
                person.out_path_len = -1
            self._send(bytes([0]))
        elif cmd == 5:
            self._send(bytes([9]) + int(self.clock.monotonic()).to_bytes(4, "little"))
        elif cmd == 56 and len(p) > 1 and p[1] == 1:
            rx = int(self.others_share / 100.0 * self.clock.monotonic())
            stats = struct.pack("<hbbII", -110, -80, 20, int(self.tx_air), rx)
            self._send(bytes([24, 1]) + stats)
        else:
            self._send(bytes([1, 1]))  # ERR_CODE_UNSUPPORTED_CMD

    def _self_info(self) -> bytes:
        out = bytes([5, 1, 22, 22]) + self.key + bytes(8) + bytes([0, 0, 0, int(self.manual_add)])
        out += int(869.525 * 1000).to_bytes(4, "little") + int(self.bw * 1000).to_bytes(4, "little")
        return out + bytes([self.sf, self.cr]) + self.name.encode()

    def _device_info(self) -> bytes:
        out = bytes([13, 9, 50, 40]) + (123456).to_bytes(4, "little")
        out += b"01-Jun-2026".ljust(12, b"\0") + b"Fake Heltec V3".ljust(40, b"\0")
        return out + b"v1.9.0".ljust(20, b"\0") + bytes([0])

    def _contact(self, person: Person) -> bytes:
        path = 0xFF if person.out_path_len < 0 else person.out_path_len
        out = (
            person.key
            + bytes([1, 0, path])
            + bytes(64)
            + person.name.encode()[:32].ljust(32, b"\0")
        )
        return out + (1000).to_bytes(4, "little") + bytes(8) + (1000).to_bytes(4, "little")

    def _contacts(self) -> None:
        listed = [p for p in self.people.values() if p.contact]
        self._send(bytes([2]) + len(listed).to_bytes(4, "little"))
        for person in listed:
            self._send(bytes([3]) + self._contact(person))
        self._send(bytes([4]) + (1000).to_bytes(4, "little"))

    def _dm(self, p: bytes) -> None:
        attempt, ts = p[2], int.from_bytes(p[3:7], "little")
        prefix, text = p[7:13], p[13:]
        person = next((x for x in self.people.values() if x.contact and x.key[:6] == prefix), None)
        if person is None:
            self._send(bytes([1, 2]))  # ERR_CODE_NOT_FOUND
            return
        if len(text) > MAX_TEXT_LEN or (attempt > 3 and len(text) > MAX_TEXT_LEN - 2):
            self._send(bytes([1, 3]))  # composeMsgPacket refused: ERR_CODE_TABLE_FULL
            return
        plain = ts.to_bytes(4, "little") + bytes([attempt & 3]) + text
        ack = hashlib.sha256(plain + self.key).digest()[:4]
        flood = person.out_path_len < 0
        self._answer(bytes([6, int(flood)]) + ack + self.suggested_timeout_ms.to_bytes(4, "little"))
        self.on_air.append(OnAir(self.clock.monotonic(), "dm", person.name, text, attempt))
        self.tx_air += self.airtime(len(text), dm=True)
        decoded = text.decode("utf-8", "replace")
        if (ts, decoded) in person.seen and attempt == 0:
            return  # the very same packet again: the recipient's seen-table drops it, no ACK
        if (ts, decoded) not in person.seen:
            person.seen.add((ts, decoded))
            person.shown.append(decoded)
        if person.lose_acks > 0:
            person.lose_acks -= 1
            return
        self._later(self.ack_delay, bytes([0x82]) + ack + (1200).to_bytes(4, "little"))

    def _channel(self, p: bytes) -> None:
        index, text = p[2], p[7:]
        on_air = (self.name.encode() + b": " + text)[:MAX_TEXT_LEN]  # the firmware's silent cut
        self.on_air.append(OnAir(self.clock.monotonic(), "channel", f"ch{index}", on_air))
        self.tx_air += self.airtime(len(text), dm=False)
        self._send(bytes([0]))

    def _later(self, delay: float, payload: bytes) -> None:
        async def push() -> None:
            await self.clock.sleep(delay)
            self._send(payload)

        task = asyncio.ensure_future(push())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
