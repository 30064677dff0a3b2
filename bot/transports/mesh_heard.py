"""What the radio heard, read for the rest of the bot: a channel text as the bridge sees it,
and the names and nodes the library's node table holds.

Pure (no meshtastic import, no I/O): functions over the library's packet dicts and its
``nodesByNum`` table, so the transport's receive path stays wiring.

Invariants:
- ``relay_text`` hands on only a text broadcast with words in it (DMs, other ports and
  empty texts never reach the bridge), its text stripped, its hops known only when the
  packet carries ``hopStart``.
- A name is a node's own announcement or nothing: ``long_name`` is None for the library's
  placeholder (``Meshtastic 1a2b``) of a node that never sent its NodeInfo; a table the
  library is still building (no ``nodesByNum`` yet) gives no name rather than an error.
- ``node_table`` copies the table (the library's thread may be writing it): at most three
  tries, an empty table when every try met it changing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from bot.bridge import MeshText
from bot.transports.mesh_rules import BROADCAST_NUM, node_id


class NodeTable(Protocol):
    """The part of the library's interface that holds what it knows per node."""

    nodesByNum: Any


def relay_text(
    packet: Mapping[str, Any], *, addressed: bool, my_num: int | None, nodes: NodeTable | None
) -> MeshText | None:
    """A channel text broadcast as the bridge sees it; None for anything else."""
    decoded = packet.get("decoded")
    frm = packet.get("from")
    if (
        not isinstance(decoded, Mapping)
        or decoded.get("portnum") != "TEXT_MESSAGE_APP"
        or packet.get("to") != BROADCAST_NUM
        or not isinstance(frm, int)
    ):
        return None
    text = decoded.get("text")
    if not isinstance(text, str) or not text.strip():
        return None
    hop_start = packet.get("hopStart")
    snr = packet.get("rxSnr")
    reply = decoded.get("replyId")
    return MeshText(
        sender=node_id(frm),
        short_name=short_name(nodes, frm),
        channel=int(packet.get("channel", 0)),
        packet_id=int(packet.get("id", 0)),
        text=text.strip(),
        addressed=addressed,
        own=frm == my_num,
        via_mqtt=bool(packet.get("viaMqtt")),
        hops=(
            max(0, int(hop_start) - int(packet.get("hopLimit", 0)))
            if isinstance(hop_start, int)
            else None
        ),
        snr=float(snr) if isinstance(snr, int | float) else None,
        reply_id=reply if isinstance(reply, int) and reply > 0 else None,
        tapback=bool(decoded.get("emoji")),
    )


def short_name(nodes: NodeTable | None, num: int) -> str | None:
    try:
        user = (nodes.nodesByNum or {}).get(num, {}).get("user", {}) if nodes else {}
    except AttributeError:
        return None
    name = user.get("shortName") if isinstance(user, dict) else None
    return name if isinstance(name, str) and name.strip() else None


def long_name(nodes: NodeTable | None, num: int) -> str | None:
    try:
        user = (nodes.nodesByNum or {}).get(num, {}).get("user", {}) if nodes else {}
    except AttributeError:
        return None
    name = user.get("longName") if isinstance(user, dict) else None
    if not isinstance(name, str) or not name or name == f"Meshtastic {node_id(num)[-4:]}":
        return None  # the library's placeholder for a node that never sent its NodeInfo
    return name


def node_table(nodes: NodeTable | None) -> dict[Any, Any]:
    """A copy of the library's node table, taken while its thread may be writing it."""
    table: dict[Any, Any] = {}
    for _ in range(3):  # the library's thread may grow the table while it is copied
        try:
            table = dict((nodes.nodesByNum or {}) if nodes is not None else {})
            break
        except (RuntimeError, AttributeError):
            continue
    return table
