"""A fake Meshtastic node that speaks the real stream protocol, for hardware-free tests.

Adapted from the verified prototype in shared/reference. The *unmodified* library classes run
against it: ``TCPInterface("127.0.0.1", portNumber=radio.port)`` (``FakeTcpRadio``) and
``SerialInterface(devPath=radio.path)`` over a pty (``FakePtyRadio``).

What it does:
- frames are 0x94 0xC3 + 16-bit big-endian length + ToRadio/FromRadio protobuf;
- answers ``want_config_id`` with my_info, node infos (itself and ``nodes``: ``KNOWN`` unless a
  test adds more), lora config
  (hop_limit 3), a PRIMARY channel and a secondary one, then ``config_complete_id``;
- acks every MeshPacket with a QueueStatus; ``report_tx_queue(0)`` announces a full TX queue
  (the library then blocks its next send forever); answers an admin metadata request (the probe);
- ``routing`` decides the end-to-end answer for a DM sent with want_ack: ACK from the
  destination by default, or a NAK (``"MAX_RETRANSMIT"``, ``"NO_CHANNEL"``...), or nothing
  (``None``: a node that never ACKs), or ``Later(answer, delay, frm)``: a delayed ACK/NAK, or
  a relay-only implicit ACK when ``frm`` is a neighbour (scheduled on the harness's clock);
- records every ToRadio with the time of ``clock`` when it was read (``log``), so tests measure
  packet spacing on the same virtual clock the transport uses;
- the receiving firmware drops a packet whose (sender, packet id) it has already received
  (``NextHopRouter::shouldFilterReceived``): a text the destination got before (a DM, a
  broadcast) and written again with the same id goes on air (``on_air``, airtime) but is not
  shown (``shown`` lists what people's radios display, ``repeats`` what they dropped). For a
  want_ack DM repeat, ``repeat_ack`` says what comes back: ``"destination"`` (default; firmware
  2.6+, the repeat heard directly from its sender: the destination sends its ACK again, hop
  limit 0), ``"relay"`` (heard through a relay, which rebroadcasts it: an implicit ACK from
  ``RELAY``), or ``None`` (firmware before 2.6, "resending real ACKs is omitted": the local
  firmware reports ``MAX_RETRANSMIT`` after its own retransmissions went unanswered);
- ``routing`` may also answer ``ACK_LOST``: the destination shows the DM but its ACK never
  reaches us (the local firmware reports ``MAX_RETRANSMIT``);
- ``ghosts`` are node ids no radio on the mesh has (a forged ``from``: ``forge_text``): a
  want_ack DM to one is shown to nobody and, whatever ``routing`` says, the local firmware
  reports ``MAX_RETRANSMIT`` ``GHOST_GIVE_UP`` seconds later, after its own three
  retransmissions went unanswered (as ``ReliableRouter`` does); a forged packet adds no
  NodeInfo to the node DB (the library shows a placeholder user for its sender);
- reports the local node's device metrics as the firmware does, computed from what is on air:
  ``channelUtilization`` = the bot's own text packets' LoRa time on air in the last minute
  (``lora_airtime``, ``preset``) + ``others_util`` (other nodes' traffic, a knob tests turn
  up for a spike), ``airUtilTx`` = its own time on air in the last hour (or ``air_util_tx``
  when a test sets it: relays and other traffic of the node); in its node info at connect and
  as a TELEMETRY packet every ``metrics_every`` seconds (60, like the firmware; the mesh
  harness drives it on its clock) and after every text it sends (``report_after_send``);
  ``metrics = False`` is an old firmware that reports none, ``stop_reporting()`` a radio that
  stops sending its reports;
- ``settle()`` waits until everything the library wrote has been read and handled; the fake
  clock calls it before it moves time.
- Every radio ever built is registered; ``check_on_air`` enforces the on-air rules on what it
  received (every text packet <= ``MAX_TEXT_BYTES``, consecutive texts of one client connection
  >= ``min_spacing`` apart), and an autouse fixture in ``tests/conftest.py`` runs it after
  *every* test, so no test can put an oversized or too-close packet on the fake air unnoticed.
- a text DM arrives PKI-encrypted (``pki_encrypted`` and the sender's ``public_key``, as
  firmware 2.5+ delivers a DM between nodes that know each other's keys), with the node's own
  key (``node_key``); ``pki_encrypted=False`` is an older firmware's DM (or a forged one),
  ``public_key=`` another key. Broadcasts carry no PKI.
Failure modes: ``freeze`` (the current link goes silent), TCP ``drop_connection``/``stop``/
``restart`` (server disappears and returns), pty ``unplug``/``replug``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import random
import select
import socket
import threading
import time
import tty
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from meshtastic.protobuf import admin_pb2, channel_pb2, mesh_pb2, portnums_pb2, telemetry_pb2

from bot.transports.mesh_airtime import lora_airtime

START1, START2 = 0x94, 0xC3
MY_NUM = 0x1234ABCD
BROADCAST = 0xFFFFFFFF
ALICE = 0xA11CE001  # in the node DB (has a name)
BOB = 0xB0B00002  # in the node DB
STRANGER = 0x5EC12E7  # not in the node DB: fromId is None
KNOWN = {ALICE: ("Alice", "ALC"), BOB: ("Bob", "BOB")}
MAX_TEXT_BYTES = 200  # what the official apps send; the transport's chunk_bytes ceiling
FIRMWARE_SPACING = 2.1  # the firmware drops a client's second text within 2 s (config floor)
RELAY = 0x0E1A7001  # a neighbour that relays (implicit ACKs)
ACK_LOST = "ACK_LOST"  # a routing answer: the destination shows the DM, its ACK is lost
# The firmware's three retransmissions of an unanswered want_ack packet and its wait for the
# last one take about this long on LongFast before it reports MAX_RETRANSMIT.
GHOST_GIVE_UP = 20.0


class _Clock(Protocol):
    def monotonic(self) -> float: ...


class _WallClock:
    def monotonic(self) -> float:
        return time.monotonic()


def node_key(num: int) -> bytes:
    """The 32-byte public key of the fake node ``num`` (stable across tests)."""
    return hashlib.sha256(f"fake-node-key-{num:08x}".encode()).digest()


def frame(msg: Any) -> bytes:
    b = bytes(msg.SerializeToString())
    return bytes([START1, START2, len(b) >> 8, len(b) & 0xFF]) + b


TEXT_PORT = portnums_pb2.PortNum.TEXT_MESSAGE_APP
_RADIOS: list[_Radio] = []  # every radio built in this process (see check_on_air)


def radios_built() -> int:
    """A mark for ``check_radios_since``: how many radios exist so far."""
    return len(_RADIOS)


def check_radios_since(mark: int) -> None:
    """Apply ``check_on_air`` to every radio built after ``mark`` (the suite-wide guard)."""
    radios = _RADIOS[mark:]
    del _RADIOS[mark:]  # nothing is kept alive beyond the test that built it
    for radio in radios:
        check_on_air(radio)


def check_on_air(radio: _Radio, *, spacing: float | None = None) -> None:
    """Fail unless every text the radio received fits ``MAX_TEXT_BYTES`` and is spaced.

    ``spacing=None`` applies the radio's ``min_spacing`` between consecutive texts of the same
    client connection (the firmware's rate limit is per connection); an explicit ``spacing``
    applies across reconnects too (the transport keeps its pacing over a new link).
    """
    for conn, t, packet in radio.on_air:
        size = len(packet.decoded.payload)
        assert size <= MAX_TEXT_BYTES, f"{size}-byte text on air (connection {conn}, t={t})"
    gap = radio.min_spacing if spacing is None else spacing
    for (c1, t1, _), (c2, t2, _) in itertools.pairwise(radio.on_air):
        if spacing is None and c1 != c2:
            continue
        assert t2 - t1 >= gap, f"texts {t2 - t1:.3f} s apart on air (< {gap} s) at t={t2}"


def ack_from_destination(packet: mesh_pb2.MeshPacket, attempt: int) -> str | Later | None:
    return "NONE" if packet.want_ack else None


def _delivered(answer: str | Later | None, dest: int) -> bool:
    """Whether a DM's routing answer says its destination received it (its own ACK)."""
    if isinstance(answer, Later):
        return answer.answer == "NONE" and answer.frm in (None, dest)
    return answer in ("NONE", ACK_LOST)


@dataclass(frozen=True)
class Later:
    """A routing answer that arrives ``delay`` seconds (on the radio's clock) after the packet:
    a delayed ACK, a NAK after the firmware's retransmissions, or, with ``frm`` set to another
    node, a relay-only (implicit) ACK. The mesh harness schedules it on its fake clock."""

    answer: str
    delay: float
    frm: int | None = None


class _Radio:
    def __init__(self, *, clock: _Clock | None = None) -> None:
        self.clock: _Clock = clock or _WallClock()
        self.log: list[tuple[float, mesh_pb2.ToRadio]] = []
        # (client connection number, time read, packet) for every text packet
        self.on_air: list[tuple[int, float, mesh_pb2.MeshPacket]] = []
        self.shown: list[tuple[float, mesh_pb2.MeshPacket]] = []  # displayed by receivers
        self.repeats: list[tuple[float, mesh_pb2.MeshPacket]] = []  # dropped as already seen
        self._received: set[tuple[int, int]] = set()  # (sender, packet id) a receiver has
        self.connections = 0  # client connections (TCP accepts, pty plug-ins) so far
        self.min_spacing = FIRMWARE_SPACING  # the harness raises it to the configured spacing
        self.routing: Callable[[mesh_pb2.MeshPacket, int], str | Later | None] = (
            ack_from_destination
        )
        self.scheduled: list[tuple[int, int, Later]] = []  # (packet id, dest, answer) to schedule
        self.ghosts: set[int] = set()  # node ids no radio has (forged senders)
        self.nodes: dict[int, tuple[str, str]] = dict(KNOWN)  # node DB: (long, short) names
        self.answer_probes = True
        self.repeat_ack: str | None = "destination"  # who ACKs a DM repeat (module docstring)
        self.frozen = False
        self.metrics = True  # False: an old firmware without device metrics
        self.others_util = 0.0  # percent of the channel other nodes' packets take
        self.air_util_tx: float | None = None  # set: the node's reported hourly TX share
        self.metrics_every = 60.0  # the firmware's device-metrics interval to its client
        self.report_after_send = True  # also report right after each text (quick tests)
        self.reports = 0  # device-metrics reports sent so far
        self.preset = "LONG_FAST"
        self._tx: list[tuple[float, float]] = []  # (time, seconds on air) of our text packets
        self._attempts: dict[bytes, int] = {}
        self._buf = b""
        self._lock = threading.RLock()  # held while reading+handling input (see settle)
        self._pid = 0x10000
        _RADIOS.append(self)

    # --- transport hooks -------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def _readable(self) -> bool:
        raise NotImplementedError

    def send(self, fr: mesh_pb2.FromRadio) -> None:
        with contextlib.suppress(OSError):
            self._write(frame(fr))

    def settle(self) -> bool:
        """Block (briefly) until all input is read and handled. True if it had to wait."""
        waited = False
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            with self._lock:
                if not self._readable():
                    return waited
            waited = True
            time.sleep(0.001)
        return waited

    def _feed(self, data: bytes) -> None:
        self._buf += data
        while True:
            i = self._buf.find(bytes([START1, START2]))
            if i < 0 or len(self._buf) < i + 4:
                return
            n = (self._buf[i + 2] << 8) | self._buf[i + 3]
            if len(self._buf) < i + 4 + n:
                return
            tr = mesh_pb2.ToRadio()
            tr.ParseFromString(self._buf[i + 4 : i + 4 + n])
            self._buf = self._buf[i + 4 + n :]
            now = self.clock.monotonic()
            self.log.append((now, tr))
            if tr.HasField("packet") and tr.packet.decoded.portnum == TEXT_PORT:
                self.on_air.append((self.connections, now, tr.packet))
            if not self.frozen:
                self._on_toradio(tr)

    def _on_toradio(self, tr: mesh_pb2.ToRadio) -> None:
        if tr.HasField("want_config_id"):
            self._send_config(tr.want_config_id)
        elif tr.HasField("packet"):
            fr = mesh_pb2.FromRadio()
            fr.queueStatus.free = 15
            fr.queueStatus.maxlen = 16
            fr.queueStatus.mesh_packet_id = tr.packet.id
            self.send(fr)
            self._respond(tr.packet)

    def _send_config(self, config_id: int) -> None:
        fr = mesh_pb2.FromRadio()
        fr.my_info.my_node_num = MY_NUM
        self.send(fr)
        for num, (long, short) in [(MY_NUM, ("Bot", "BOT")), *self.nodes.items()]:
            fr = mesh_pb2.FromRadio()
            fr.node_info.num = num
            fr.node_info.user.id = f"!{num:08x}"
            fr.node_info.user.long_name = long
            fr.node_info.user.short_name = short
            if num == MY_NUM and self.metrics:
                util, tx = self.device_metrics()
                fr.node_info.device_metrics.channel_utilization = util
                fr.node_info.device_metrics.air_util_tx = tx
                fr.node_info.device_metrics.uptime_seconds = 60
            self.send(fr)
        fr = mesh_pb2.FromRadio()
        fr.config.lora.hop_limit = 3
        self.send(fr)
        for index, role in (
            (0, channel_pb2.Channel.Role.PRIMARY),
            (1, channel_pb2.Channel.Role.SECONDARY),
        ):
            fr = mesh_pb2.FromRadio()
            fr.channel.index = index
            fr.channel.role = role
            self.send(fr)
        fr = mesh_pb2.FromRadio()
        fr.config_complete_id = config_id
        self.send(fr)

    def _respond(self, packet: mesh_pb2.MeshPacket) -> None:
        port = packet.decoded.portnum
        if port == portnums_pb2.PortNum.ADMIN_APP and self.answer_probes:
            req = admin_pb2.AdminMessage()
            req.ParseFromString(packet.decoded.payload)
            if req.HasField("get_device_metadata_request"):
                resp = admin_pb2.AdminMessage()
                resp.get_device_metadata_response.firmware_version = "2.7.11.fake"
                self._inject(
                    frm=MY_NUM,
                    to=MY_NUM,
                    port=portnums_pb2.PortNum.ADMIN_APP,
                    payload=resp.SerializeToString(),
                    request_id=packet.id,
                )
        elif port == portnums_pb2.PortNum.TEXT_MESSAGE_APP:
            now = self.clock.monotonic()
            self._tx.append((now, lora_airtime(len(packet.decoded.payload), preset=self.preset)))
            if self.report_after_send:
                self.report_metrics()
            seen = (MY_NUM, packet.id)  # a client's packet carries from=0: the node fills it in
            if packet.id and seen in self._received:
                self.repeats.append((now, packet))  # the receiving firmware ignores a dupe
                if packet.to != BROADCAST and packet.want_ack:
                    if self.repeat_ack == "destination":  # firmware 2.6+: ACKed again
                        self.inject_routing(packet.id, "NONE", frm=packet.to)
                    elif self.repeat_ack == "relay":  # a relay rebroadcasts it: implicit ACK
                        self.inject_routing(packet.id, "NONE", frm=RELAY)
                    else:  # before 2.6: no ACK comes back for it
                        self.inject_routing(packet.id, "MAX_RETRANSMIT")
                return
            if packet.to == BROADCAST:
                self._received.add(seen)
                self.shown.append((now, packet))
                return
            key = packet.decoded.payload
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1
            answer = self.routing(packet, attempt)
            if packet.to in self.ghosts:  # nobody hears it; the firmware gives up
                answer = (
                    Later("MAX_RETRANSMIT", GHOST_GIVE_UP, frm=MY_NUM) if packet.want_ack else None
                )
            if not packet.want_ack or _delivered(answer, packet.to):  # the destination shows it
                self._received.add(seen)
                self.shown.append((now, packet))
            if isinstance(answer, Later):
                with self._lock:
                    self.scheduled.append((packet.id, packet.to, answer))
            elif answer == ACK_LOST:  # shown, but the local firmware never hears the ACK
                self.inject_routing(packet.id, "MAX_RETRANSMIT")
            elif answer is not None:
                self.inject_routing(packet.id, answer, frm=packet.to)

    # --- what the library sent ---------------------------------------------------------------
    def sent_packets(self) -> list[mesh_pb2.MeshPacket]:
        return [m.packet for _, m in self.log if m.HasField("packet")]

    def sent_texts(self) -> list[tuple[float, mesh_pb2.MeshPacket]]:
        """(time read, packet) for every text packet the library wrote."""
        return [(t, packet) for _, t, packet in self.on_air]

    def texts(self) -> list[str]:
        return [p.decoded.payload.decode("utf-8") for _, p in self.sent_texts()]

    # --- what the mesh sends us --------------------------------------------------------------
    def next_id(self) -> int:
        self._pid += 1
        return self._pid

    def _inject(
        self,
        *,
        frm: int,
        to: int,
        port: int,
        payload: bytes,
        channel: int = 0,
        pid: int | None = None,
        request_id: int | None = None,
        reply_id: int | None = None,
        emoji: int = 0,
        via_mqtt: bool = False,
        encrypted: bool = False,
        pki_encrypted: bool | None = None,
        public_key: bytes | None = None,
    ) -> int:
        fr = mesh_pb2.FromRadio()
        p = fr.packet
        setattr(p, "from", frm)  # 'from' is a Python keyword
        p.to, p.channel, p.id = to, channel, pid if pid is not None else self.next_id()
        p.rx_snr, p.rx_rssi, p.hop_limit, p.hop_start = 6.5, -80, 2, 3
        p.rx_time = int(time.time())
        if via_mqtt:
            p.via_mqtt = True
        if pki_encrypted is None:  # firmware 2.5+: a text DM between nodes that know each other
            pki_encrypted = to != BROADCAST and port == portnums_pb2.PortNum.TEXT_MESSAGE_APP
        if pki_encrypted and not encrypted:
            p.pki_encrypted = True
            p.public_key = public_key if public_key is not None else node_key(frm)
        if encrypted:
            p.encrypted = payload  # the node could not decrypt it: no 'decoded'
        else:
            p.decoded.portnum = port
            p.decoded.payload = payload
            if request_id is not None:
                p.decoded.request_id = request_id
            if reply_id is not None:
                p.decoded.reply_id = reply_id
            if emoji:
                p.decoded.emoji = emoji
        self.send(fr)
        return int(p.id)

    def inject_text(
        self,
        text: str | bytes,
        *,
        frm: int = ALICE,
        to: int = MY_NUM,
        channel: int = 0,
        pid: int | None = None,
        port: int = portnums_pb2.PortNum.TEXT_MESSAGE_APP,
        **kw: Any,
    ) -> int:
        payload = text if isinstance(text, bytes) else text.encode("utf-8")
        return self._inject(
            frm=frm, to=to, port=port, payload=payload, channel=channel, pid=pid, **kw
        )

    def forge_text(self, text: str, *, frm: int, **kw: Any) -> int:
        """A DM whose ``from`` names a node that does not exist (``ghosts``), sent with the
        channel key as anyone may (no PKI: no radio holds a key for an invented node)."""
        self.ghosts.add(frm)
        kw.setdefault("pki_encrypted", False)
        return self.inject_text(text, frm=frm, **kw)

    def inject_routing(self, request_id: int, error: str = "NONE", *, frm: int = MY_NUM) -> None:
        """Routing ACK (error 'NONE') or NAK (e.g. 'MAX_RETRANSMIT') for ``request_id``."""
        rt = mesh_pb2.Routing()
        rt.error_reason = mesh_pb2.Routing.Error.Value(error)
        self._inject(
            frm=frm,
            to=MY_NUM,
            port=portnums_pb2.PortNum.ROUTING_APP,
            payload=rt.SerializeToString(),
            request_id=request_id,
        )

    def device_metrics(self) -> tuple[float, float]:
        """(channelUtilization, airUtilTx) in percent, from what is on air now."""
        now = self.clock.monotonic()
        minute = sum(a for t, a in self._tx if t >= now - 60.0)
        hour = sum(a for t, a in self._tx if t >= now - 3600.0)
        tx = 100.0 * hour / 3600.0 if self.air_util_tx is None else self.air_util_tx
        return min(100.0, self.others_util + 100.0 * minute / 60.0), tx

    def report_metrics(self) -> None:
        """A device-metrics TELEMETRY packet from the local node (if it reports metrics)."""
        if not self.metrics or self.frozen:  # a wedged node sends nothing, reports included
            return
        self.reports += 1
        util, tx = self.device_metrics()
        tm = telemetry_pb2.Telemetry()
        tm.device_metrics.channel_utilization = util
        tm.device_metrics.air_util_tx = tx
        tm.device_metrics.uptime_seconds = 60
        self._inject(
            frm=MY_NUM,
            to=BROADCAST,
            port=portnums_pb2.PortNum.TELEMETRY_APP,
            payload=tm.SerializeToString(),
        )

    def stop_reporting(self) -> None:
        """The radio stops sending device metrics (a firmware that stopped its telemetry)."""
        self.metrics = False

    def inject_channel_utilization(self, percent: float) -> None:
        """Other nodes now take ``percent`` of the channel; the node reports its metrics."""
        self.others_util = percent
        self.report_metrics()

    def report_tx_queue(self, free: int) -> None:
        """An unsolicited QueueStatus (as the firmware sends when its TX queue changes)."""
        fr = mesh_pb2.FromRadio()
        fr.queueStatus.free = free
        fr.queueStatus.maxlen = 16
        self.send(fr)

    def freeze(self) -> None:
        """The link stays up but the node answers nothing (a wedged firmware or half-open TCP)."""
        self.frozen = True


class FakeTcpRadio(_Radio):
    """A WiFi node / meshtasticd on 127.0.0.1. One client at a time, like the firmware."""

    def __init__(self, *, clock: _Clock | None = None) -> None:
        super().__init__(clock=clock)
        self.conn: socket.socket | None = None
        self._srv: socket.socket | None = None
        self.port = 0
        self._listen()

    def _listen(self) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.port:
            srv.bind(("127.0.0.1", self.port))
        else:
            # Below the kernel's ephemeral range: while the server is down, a reconnect to an
            # ephemeral port could otherwise connect the client to itself (TCP self-connect).
            for _ in range(100):
                try:
                    srv.bind(("127.0.0.1", random.randint(20000, 30000)))
                    break
                except OSError:
                    continue
        srv.listen(4)
        self._srv = srv
        self.port = srv.getsockname()[1]
        threading.Thread(target=self._serve, args=(srv,), daemon=True, name="fake-radio").start()

    def _write(self, data: bytes) -> None:
        if self.conn is not None:
            self.conn.sendall(data)

    def _readable(self) -> bool:
        conn = self.conn
        if conn is None:
            return False
        try:
            return bool(select.select([conn], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def _serve(self, srv: socket.socket) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle delays
            with self._lock:
                self.conn, self._buf, self.frozen = conn, b"", False
                self.connections += 1
            while True:
                try:
                    ready = select.select([conn], [], [], 0.05)[0]
                except (OSError, ValueError):
                    break
                if not ready:
                    continue
                with self._lock:
                    try:
                        d = conn.recv(4096)
                    except OSError:
                        d = b""
                    if not d:
                        self.conn = None
                        break
                    self._feed(d)
            with contextlib.suppress(OSError):
                conn.close()

    def drop_connection(self) -> None:
        """Close the client's socket (the library then tries one silent reconnect)."""
        conn = self.conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()

    def stop(self) -> None:
        """The server disappears: no new connections, the current one is dropped."""
        if self._srv is not None:
            with contextlib.suppress(OSError):  # wakes the blocked accept() on Linux
                self._srv.shutdown(socket.SHUT_RDWR)
            self._srv.close()
            self._srv = None
        self.drop_connection()

    def restart(self) -> None:
        """The server comes back on the same port."""
        self._listen()


class FakePtyRadio(_Radio):
    """A USB serial node, as a pty. ``unplug``/``replug`` mimic pulling the cable."""

    def __init__(self, *, clock: _Clock | None = None) -> None:
        super().__init__(clock=clock)
        self.path = ""
        self.master = -1
        self._slave = -1
        self._plug()

    def _plug(self) -> None:
        self.master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.path = os.ttyname(self._slave)
        self._buf, self.frozen = b"", False
        self.connections += 1
        self._stop = threading.Event()
        threading.Thread(
            target=self._run, args=(self.master, self._stop), daemon=True, name="fake-pty"
        ).start()

    def _write(self, data: bytes) -> None:
        if self.master >= 0:
            os.write(self.master, data)

    def _readable(self) -> bool:
        if self.master < 0:
            return False
        try:
            return bool(select.select([self.master], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def _run(self, master: int, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                ready = select.select([master], [], [], 0.05)[0]
            except (OSError, ValueError):
                return
            if not ready:
                continue
            with self._lock:
                try:
                    d = os.read(master, 4096)
                except OSError:
                    return
                if not d:
                    return
                self._feed(d)

    def unplug(self) -> None:
        """The SerialInterface reader sees EOF/an error and publishes connection.lost."""
        self._stop.set()
        time.sleep(0.1)  # let the pump thread leave select before its fd closes
        with self._lock:
            master, slave = self.master, self._slave
            self.master = self._slave = -1
        for fd in (master, slave):
            with contextlib.suppress(OSError):
                os.close(fd)

    def replug(self) -> None:
        """Plugged back in; like a real re-enumeration it may come back under a new path."""
        self._plug()
