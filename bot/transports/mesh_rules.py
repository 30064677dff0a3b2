"""Mesh receive rules, duplicate and cooldown bookkeeping, backoff and the clock port.

Pure logic over the library's packet dicts (``MessageToDict`` of a MeshPacket: camelCase keys,
zero values omitted); no meshtastic import, so everything here is table-tested without a radio.

Invariants:
- The sender is always derived from the numeric ``from`` (``!xxxxxxxx``), never from ``fromId``,
  which is missing for nodes the radio has not heard a NodeInfo from.
- A packet is answered only when it is a text DM to our node, or a text broadcast on an allowed
  channel that carries the trigger. Our own packets, MQTT-relayed packets (when configured),
  tapback reactions, ignored nodes, numbered bot output, undecryptable packets and empty texts
  are dropped with a reason (logged by the caller at DEBUG/INFO, never with the text).
- A channel text triggers only when it starts with the trigger (the first word), carries it as
  an ``@mention`` anywhere (triggers starting with ``@``), or starts with a *known* command
  (``!help``, not another bot's ``!ping`` or a line of ``!!!``). The bot's name mid-sentence
  without ``@`` does not trigger.
- ``Dedup`` recognises a message by identity, not text: (sender, packet id). Rebroadcasts and
  MQTT copies carry the same id, so they are dropped; the same words sent again (a new packet
  id) are a new message. Text floods are the responder's rate limit's business.
- ``Backoff`` yields ``initial * 2**n`` capped at ``maximum``, with +-20% jitter, forever.
"""

from __future__ import annotations

import random
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bot.domain import DM_SPACE

BROADCAST_NUM = 0xFFFFFFFF  # meshtastic.BROADCAST_NUM
TEXT_PORT = "TEXT_MESSAGE_APP"
_NUMBERED = re.compile(r"^\(\d{1,2}/\d{1,2}\) ")  # another bot's numbered part: loop guard


class Clock(Protocol):
    """Monotonic time and sleeping; tests inject a virtual clock."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(max(0.0, seconds))


def node_id(num: int) -> str:
    return f"!{num & 0xFFFFFFFF:08x}"


def node_num(ident: str) -> int:
    """``"!1234abcd"`` -> 0x1234ABCD (raises ValueError for anything else)."""
    if not re.fullmatch(r"![0-9a-fA-F]{8}", ident):
        raise ValueError(f"not a node id: {ident!r}")
    return int(ident[1:], 16)


def channel_space(index: int) -> str:
    return f"ch{index}"


def space_channel(space: str) -> int | None:
    """``"ch2"`` -> 2; ``None`` for the DM space or anything else."""
    m = re.fullmatch(r"ch([0-7])", space)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class ReceiveRules:
    channels: frozenset[int]  # where triggers are answered
    mention: str  # "@meshsage"
    command_prefix: str | None  # "!" when a prefix counts as a trigger
    ignore_nodes: frozenset[int]
    ignore_mqtt: bool = True
    commands: frozenset[str] = frozenset()  # known command names; others do not trigger


@dataclass(frozen=True, slots=True)
class Accepted:
    sender: str
    sender_num: int
    text: str
    space: str
    channel: int
    packet_id: int
    reply_to: int | None
    repaired_utf8: bool = False

    @property
    def is_dm(self) -> bool:
        return self.space == DM_SPACE


@dataclass(frozen=True, slots=True)
class Dropped:
    reason: str  # short, no message text (privacy)


def classify(packet: Mapping[str, Any], *, my_num: int, rules: ReceiveRules) -> Accepted | Dropped:
    """Decide whether a received packet is a message for the bot."""
    frm = packet.get("from")
    if not isinstance(frm, int):
        return Dropped("no sender")
    if frm == my_num:
        return Dropped("our own packet")
    if rules.ignore_mqtt and packet.get("viaMqtt"):
        return Dropped("relayed from MQTT")
    decoded = packet.get("decoded")
    if not isinstance(decoded, Mapping):
        if packet.get("encrypted") is not None or packet.get("pkiEncrypted"):
            return Dropped("could not decrypt (no shared channel key or PKI key)")
        return Dropped("no payload")
    if decoded.get("portnum") != TEXT_PORT:
        return Dropped(f"not text ({decoded.get('portnum', 'UNKNOWN_APP')})")
    if decoded.get("emoji"):
        return Dropped("tapback reaction")
    if frm in rules.ignore_nodes:
        return Dropped("ignored node")
    repaired = False
    text = decoded.get("text")
    if not isinstance(text, str):
        payload = decoded.get("payload", b"")
        if not isinstance(payload, bytes | bytearray):
            return Dropped("no payload")
        text = bytes(payload).decode("utf-8", errors="replace")
        repaired = True
    # A DM of nothing but invalid UTF-8 is handed on, so the person hears it was unreadable;
    # the same on a channel carries no trigger.
    unreadable_dm = repaired and packet.get("to", 0) == my_num
    if not text.replace("\ufffd", "").strip() and not unreadable_dm:
        return Dropped("invalid UTF-8" if repaired else "empty text")
    if _NUMBERED.match(text):
        return Dropped("numbered bot output (loop guard)")
    to = packet.get("to", 0)
    channel = int(packet.get("channel", 0))
    pid = int(packet.get("id", 0))
    reply = decoded.get("replyId")
    reply_to = int(reply) if isinstance(reply, int) and reply else None
    sender = node_id(frm)
    if to == my_num:
        return Accepted(sender, frm, text.strip(), DM_SPACE, channel, pid, reply_to, repaired)
    if to != BROADCAST_NUM:
        return Dropped("addressed to another node")
    if channel not in rules.channels:
        return Dropped(f"channel {channel} not enabled")
    body = strip_trigger(
        text, mention=rules.mention, command_prefix=rules.command_prefix, commands=rules.commands
    )
    if body is None:
        return Dropped("no trigger")
    if not body:
        return Dropped("trigger without a question")
    return Accepted(sender, frm, body, channel_space(channel), channel, pid, reply_to, repaired)


def strip_trigger(
    text: str,
    *,
    mention: str,
    command_prefix: str | None,
    commands: frozenset[str] | None = None,
) -> str | None:
    """The message without its trigger; the whole text for a known command; None if the text
    is not addressed to the bot (see the module docstring). ``commands=None`` accepts any
    alphabetic command name."""
    stripped = text.strip()
    word = rf"{re.escape(mention)}(?!\w)[\s,:;.!?-]*"
    first = re.match(word, stripped, re.IGNORECASE)
    if first:
        return " ".join(stripped[first.end() :].split())
    if mention.startswith("@"):
        anywhere = re.compile(rf"(?<!\w){word}", re.IGNORECASE)
        if anywhere.search(stripped):
            return " ".join(anywhere.sub(" ", stripped).split())
    if command_prefix and stripped.startswith(command_prefix):
        name = stripped[len(command_prefix) :].split(maxsplit=1)
        if name and name[0].isalpha() and (commands is None or name[0].lower() in commands):
            return stripped
    return None


class Dedup:
    """Remembers (sender, packet id) for ``window`` seconds (bounded)."""

    def __init__(self, *, window: float, capacity: int = 2048) -> None:
        self._window = window
        self._capacity = capacity
        self._seen: OrderedDict[tuple[int, int], float] = OrderedDict()

    def is_duplicate(self, *, sender: int, packet_id: int, now: float) -> bool:
        self._expire(now)
        if not packet_id:  # no identity to compare: never call it a copy
            return False
        key = (sender, packet_id)
        if key in self._seen:
            return True
        self._seen[key] = now
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return False

    def _expire(self, now: float) -> None:
        while self._seen:
            key, seen_at = next(iter(self._seen.items()))
            if now - seen_at < self._window:
                break
            del self._seen[key]


class Cooldown:
    """Per-key minimum interval; ``ready_at`` tells when a key may act again."""

    def __init__(self, *, seconds: float) -> None:
        self.seconds = seconds
        self._last: dict[str, float] = {}

    def ready_at(self, key: str) -> float:
        last = self._last.get(key)
        return float("-inf") if last is None else last + self.seconds

    def note(self, key: str, now: float) -> None:
        self._last[key] = now
        if len(self._last) > 4096:  # forget the oldest half; a cooldown is short-lived
            for k in sorted(self._last, key=self._last.__getitem__)[:2048]:
                del self._last[k]


class Backoff:
    """Exponential backoff with jitter: initial, 2x, 4x, ... capped at maximum, forever."""

    def __init__(self, *, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        self._initial = initial
        self._maximum = maximum
        self._rng = rng or random.Random()
        self._n = 0

    def next(self) -> float:
        base = min(self._maximum, self._initial * (1 << min(self._n, 32)))
        self._n += 1
        return min(self._maximum, base * self._rng.uniform(0.8, 1.2))

    def reset(self) -> None:
        self._n = 0
