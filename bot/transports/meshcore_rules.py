"""MeshCore receive rules, text limits and airtime: pure functions over the library's payloads.

No ``meshcore`` import: the payloads are the dicts the ``meshcore`` library (2.3.x) dispatches
(``CONTACT_MSG_RECV``: ``pubkey_prefix``, ``txt_type``, ``sender_timestamp``, ``text``;
``CHANNEL_MSG_RECV``: ``channel_idx``, ``txt_type``, ``sender_timestamp``, ``text``), so every
rule here is table-tested without a radio.

Facts this module relies on (companion firmware, ``BaseChatMesh``; checked against the library):
- A text is at most ``MAX_TEXT_LEN`` (160) UTF-8 bytes. ``composeMsgPacket`` refuses a DM of
  more, and one of more than 158 from the fifth attempt on (the attempt number then travels at
  the payload's tail), so DM parts are at most ``DM_TEXT_BYTES`` (158): every part stays
  re-sendable.
- On a channel the firmware prepends ``"<node name>: "`` and *silently cuts* the text at
  ``MAX_TEXT_LEN - len(prefix)`` bytes (possibly inside a UTF-8 sequence). A channel part is
  therefore at most ``160 - len(name) - 2`` bytes; an unknown name counts as the longest the
  firmware stores (``NAME_MAX_BYTES``, 31).
- A received DM names its sender by the first 6 bytes of its public key; the companion only
  decrypts a DM from a contact it holds the key of (the shared secret is derived from it), so
  a DM resolved to exactly one contact's full key is *authenticated* by that key. A channel
  text carries only the name the sender typed into its own node: never authenticated.

Invariants:
- ``classify_dm``/``classify_channel`` return ``Accepted`` or ``Dropped`` (a short reason,
  never the text). Dropped: non-plain texts (CLI data, signed room-server posts), empty texts,
  numbered bot output (loop guard), ignored keys/names, our own name on a channel, channels not
  enabled, channel texts without the trigger.
- A DM sender is its full public key (64 hex digits) when the contact table resolves the
  prefix to one key; otherwise the 12-digit prefix, unauthenticated.
- A channel sender is ``"~" + name``: it can never equal a key (hex digits only), so a channel
  speaker never shares a conversation, memory or operator power with a DM key.
- ``message_id`` is stable for one message (sender, the sender's timestamp, a hash of the
  text): a copy delivered again after a reconnect is recognised by ``Dedup`` in ``mesh_rules``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bot.domain import DM_SPACE
from bot.transports.mesh_rules import strip_trigger
from bot.transports.mesh_text import utf8_len
from bot.transports.mesh_view import NodeBook, NodeSeen

MAX_TEXT_LEN = 160  # BaseChatMesh.h: 10 * CIPHER_BLOCK_SIZE
DM_TEXT_BYTES = MAX_TEXT_LEN - 2  # re-sendable after the fourth attempt (composeMsgPacket)
NAME_MAX_BYTES = 31  # node_name[32] in the firmware's prefs, NUL included
NAME_SEPARATOR = ": "  # sendGroupMessage: "<sender>: <msg>"
TXT_PLAIN = 0  # TXT_TYPE_PLAIN; 1 is CLI data, 2 a signed (room server) post
KEY_HEX = 64
PREFIX_HEX = 12
_NUMBERED = re.compile(r"^\(\d{1,2}/\d{1,2}\) ")  # another bot's numbered part: loop guard
_SPACE = re.compile(r"ch([0-9]{1,2})")


def chunk_bytes(name: str | None, *, cap: int) -> int:
    """Bytes one part may carry so that it fits a DM and a channel text once the firmware
    prepended ``name`` (unknown: the longest name it stores)."""
    prefix = (utf8_len(name) if name is not None else NAME_MAX_BYTES) + len(NAME_SEPARATOR)
    return max(1, min(cap, DM_TEXT_BYTES, MAX_TEXT_LEN - prefix))


def channel_space(index: int) -> str:
    return f"ch{index}"


def space_channel(space: str) -> int | None:
    """``"ch2"`` -> 2; None for the DM space or anything else."""
    m = _SPACE.fullmatch(space)
    return int(m.group(1)) if m else None


def channel_sender(name: str) -> str:
    return "~" + name


@dataclass(frozen=True, slots=True)
class Rules:
    channels: frozenset[int]  # where triggers are answered
    mention: str  # "@meshsage"
    command_prefix: str | None  # "!" when a prefix counts as a trigger
    commands: frozenset[str] = frozenset()  # known command names
    ignore_names: frozenset[str] = frozenset()  # case-folded
    ignore_keys: tuple[str, ...] = ()  # hex keys or prefixes


@dataclass(frozen=True, slots=True)
class Accepted:
    sender: str  # full key, key prefix (DM) or "~name" (channel)
    text: str
    space: str
    channel: int | None  # None for a DM
    message_id: str
    authenticated: bool
    name: str | None = None  # display name (the contact's advert name, or the channel name)
    prefix: str | None = None  # the 12-hex-digit key prefix a DM is answered to

    @property
    def is_dm(self) -> bool:
        return self.space == DM_SPACE


@dataclass(frozen=True, slots=True)
class Dropped:
    reason: str  # short, no message text (privacy)


def _message_id(sender: str, timestamp: int, text: str) -> str:
    digest = hashlib.sha256(f"{sender}|{timestamp}|{text}".encode()).hexdigest()[:8]
    return f"{timestamp:x}-{digest}"


def _common(payload: Mapping[str, Any]) -> tuple[str, int] | Dropped:
    if payload.get("txt_type", TXT_PLAIN) != TXT_PLAIN:
        return Dropped(f"not plain text (type {payload.get('txt_type')})")
    text = payload.get("text")
    if not isinstance(text, str) or not text.strip():
        return Dropped("empty text")
    ts = payload.get("sender_timestamp")
    return text, ts if isinstance(ts, int) else 0


def classify_dm(
    payload: Mapping[str, Any],
    *,
    rules: Rules,
    resolve: Callable[[str], tuple[tuple[str, str], ...]],
) -> Accepted | Dropped:
    """A DM: ``resolve(prefix)`` gives the contacts (full key, advert name) whose key starts
    with the 12-digit ``prefix``."""
    prefix = payload.get("pubkey_prefix")
    if not isinstance(prefix, str) or not re.fullmatch(r"[0-9a-f]{12}", prefix):
        return Dropped("no sender key")
    common = _common(payload)
    if isinstance(common, Dropped):
        return common
    text, ts = common
    matches = resolve(prefix)
    if len(matches) == 1:
        key, name = matches[0]
        sender, authenticated = key, True
    else:  # unknown to our copy of the table, or two keys share the prefix: no identity
        sender, name, authenticated = prefix, None, False
    if any(sender.startswith(k) or k.startswith(sender) for k in rules.ignore_keys):
        return Dropped("ignored key")
    if _NUMBERED.match(text):
        return Dropped("numbered bot output (loop guard)")
    return Accepted(
        sender=sender,
        text=text.strip(),
        space=DM_SPACE,
        channel=None,
        message_id=_message_id(sender, ts, text),
        authenticated=authenticated,
        name=name or None,
        prefix=prefix,
    )


def split_name(text: str) -> tuple[str | None, str]:
    """``"Alice: hi"`` -> ("Alice", "hi"); a text without the firmware's prefix -> (None, text)."""
    name, sep, body = text.partition(NAME_SEPARATOR)
    if not sep or not name.strip():
        return None, text
    return name, body


def classify_channel(
    payload: Mapping[str, Any], *, rules: Rules, own_name: str | None
) -> Accepted | Dropped:
    """A channel text ``"<name>: <body>"`` (the sender's firmware put the name there)."""
    index = payload.get("channel_idx")
    if not isinstance(index, int):
        return Dropped("no channel")
    common = _common(payload)
    if isinstance(common, Dropped):
        return common
    text, ts = common
    name, body = split_name(text)
    if name is None:
        return Dropped("no sender name")
    if own_name is not None and name == own_name:
        return Dropped("our own name (an echo, or a node named like us)")
    if name.casefold() in rules.ignore_names:
        return Dropped("ignored name")
    if _NUMBERED.match(body):
        return Dropped("numbered bot output (loop guard)")
    if index not in rules.channels:
        return Dropped(f"channel {index} not enabled")
    question = strip_trigger(
        body, mention=rules.mention, command_prefix=rules.command_prefix, commands=rules.commands
    )
    if question is None:
        return Dropped("no trigger")
    if not question:
        return Dropped("trigger without a question")
    sender = channel_sender(name)
    return Accepted(
        sender=sender,
        text=question,
        space=channel_space(index),
        channel=index,
        message_id=_message_id(sender, ts, text),
        authenticated=False,
        name=name,
    )


# --- airtime -------------------------------------------------------------------------------

DM_OVERHEAD = 2 + 1 + 1 + 2  # header + path length, dest and src hashes, MAC
CHANNEL_OVERHEAD = 2 + 1 + 2  # header + path length, channel hash, MAC
PREAMBLE = 16  # symbols (MeshCore's radio setup)


def packet_bytes(text_bytes: int, *, dm: bool, name_bytes: int = 0) -> int:
    """Bytes on air for one text: the plaintext (timestamp, flags, [name: ] text) is padded
    to AES blocks of 16."""
    plain = 5 + text_bytes + (0 if dm else name_bytes + len(NAME_SEPARATOR))
    cipher = 16 * math.ceil(plain / 16)
    return cipher + (DM_OVERHEAD if dm else CHANNEL_OVERHEAD)


def lora_airtime(size: int, *, sf: int, bw_khz: float, cr: int) -> float:
    """Semtech's time on air for ``size`` bytes (explicit header, CRC on; ``cr`` 5-8)."""
    t_sym = (2**sf) / (bw_khz * 1000.0)
    low_rate = 1 if t_sym > 0.016 else 0
    denom = 4 * (sf - 2 * low_rate)
    n = 8 + max(math.ceil((8 * size - 4 * sf + 28 + 16) / denom) * cr, 0)
    return float((PREAMBLE + 4.25) * t_sym + n * t_sym)


# --- the operator's view --------------------------------------------------------------------


def contact_nodes(
    contacts: Mapping[str, Mapping[str, Any]], book: NodeBook
) -> tuple[NodeSeen, ...]:
    """The companion's contacts (the library's dicts) as the Nodes page shows them, with the
    book's message counts (keyed by the 12-digit key prefix); newest advert first."""
    nodes = []
    for key, c in contacts.items():
        mine = book.get(key[:12])
        heard = c.get("last_advert")
        path = c.get("out_path_len")
        nodes.append(
            NodeSeen(
                id=key[:12],
                name=str(c.get("adv_name") or ""),
                last_heard=float(heard) if isinstance(heard, int) and heard else None,
                hops=path if isinstance(path, int) and path >= 0 else None,
                from_node=int(mine.get("from", 0)),
                to_node=int(mine.get("to", 0)),
            )
        )
    return tuple(sorted(nodes, key=lambda n: (-(n.last_heard or 0.0), n.id)))
