"""What the Meshtastic transport shows the operator (the web view, /metrics): its airtime
figures against its limits, holds by cause, and the nodes the radio hears.

Pure (no meshtastic import, no I/O). The transport fills a ``NodeBook`` as packets arrive and
builds a ``MeshView`` on request from its pacer, its outbox and the library's node table.

Invariants:
- Counts only: a node's entry holds its last signal figures and how many messages it sent the
  bot and the bot sent it, never text.
- The book is bounded (``NODE_BOOK_SIZE`` nodes, least recently heard dropped first), so a
  busy mesh or a week of uptime keeps memory flat.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NODE_BOOK_SIZE = 4096


@dataclass(frozen=True)
class NodeSeen:
    id: str  # "!1234abcd"
    name: str = ""  # long name (short name in brackets) when the node announced one
    last_heard: float | None = None  # epoch seconds
    snr: float | None = None
    rssi: int | None = None
    hops: int | None = None
    battery: int | None = None  # percent; 101 means powered
    from_node: int = 0  # messages it sent the bot (since start)
    to_node: int = 0  # replies the bot queued for it (since start)


@dataclass(frozen=True)
class MeshView:
    link: str
    channel_utilization: float | None  # the radio's last report, percent (None: not reported)
    air_util_tx: float | None  # the node's own TX share of the hour, percent (radio)
    bot_hour_share: float  # the bot's own writes, percent of the last hour (its ledger)
    others: float | None  # the channel share other nodes take (estimate), percent
    channel_limit: float  # busy_threshold
    duty_cycle: float
    holding: str  # why replies are held now ("" when they are not)
    holds: Mapping[str, int]  # holds started since start, by cause ("channel", "duty")
    outbox_waiting: int
    nodes: tuple[NodeSeen, ...] = field(default_factory=tuple)
    # replies to senders the bot cannot confirm (mesh_strangers): seconds on air of the last
    # hour against their allowance, and how many were not sent since start
    stranger_airtime: float = 0.0
    stranger_allowance: float = 0.0
    strangers_refused: int = 0


class NodeBook:
    """Per-node signal and counts, fed on the event loop by the transport."""

    def __init__(self, *, size: int = NODE_BOOK_SIZE) -> None:
        self._size = size
        self._nodes: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def _entry(self, node: str) -> dict[str, Any]:
        entry = self._nodes.get(node)
        if entry is None:
            entry = {"from": 0, "to": 0}
            self._nodes[node] = entry
            while len(self._nodes) > self._size:
                self._nodes.popitem(last=False)
        else:
            self._nodes.move_to_end(node)
        return entry

    def heard(self, node: str, *, snr: float | None, rssi: int | None, at: float) -> None:
        entry = self._entry(node)
        entry["at"] = at
        if snr is not None:
            entry["snr"] = snr
        if rssi is not None:
            entry["rssi"] = rssi

    def message_from(self, node: str) -> None:
        self._entry(node)["from"] += 1

    def reply_to(self, node: str) -> None:
        self._entry(node)["to"] += 1

    def get(self, node: str) -> Mapping[str, Any]:
        return self._nodes.get(node, {})

    def ids(self) -> list[str]:
        return list(self._nodes)


def nodes_seen(
    table: Mapping[Any, Any] | None, book: NodeBook, *, my_id: str | None
) -> list[NodeSeen]:
    """Merge the library's node table (``nodesByNum``) with the book; the bot's own node is
    left out. The table is a snapshot the caller copied (the library's thread writes it)."""
    out: dict[str, NodeSeen] = {}
    for info in (table or {}).values():
        if not isinstance(info, Mapping):
            continue
        num = info.get("num")
        if not isinstance(num, int):
            continue
        node = f"!{num & 0xFFFFFFFF:08x}"
        if node == my_id:
            continue
        user = info.get("user")
        user = user if isinstance(user, Mapping) else {}
        long_name, short = str(user.get("longName") or ""), str(user.get("shortName") or "")
        name = f"{long_name} ({short})" if long_name and short else long_name or short
        metrics = info.get("deviceMetrics")
        metrics = metrics if isinstance(metrics, Mapping) else {}
        mine = book.get(node)
        heard = info.get("lastHeard")
        out[node] = NodeSeen(
            id=node,
            name=name,
            last_heard=max(
                (float(x) for x in (heard, mine.get("at")) if isinstance(x, int | float)),
                default=None,
            ),
            snr=_num(info.get("snr"), mine.get("snr")),
            rssi=_int(mine.get("rssi")),
            hops=_int(info.get("hopsAway")),
            battery=_int(metrics.get("batteryLevel")),
            from_node=int(mine.get("from", 0)),
            to_node=int(mine.get("to", 0)),
        )
    for node in book.ids():  # heard by packet but not (yet) in the library's table
        if node not in out and node != my_id:
            mine = book.get(node)
            at = mine.get("at")
            out[node] = NodeSeen(
                id=node,
                last_heard=float(at) if isinstance(at, int | float) else None,
                snr=_num(mine.get("snr")),
                rssi=_int(mine.get("rssi")),
                from_node=int(mine.get("from", 0)),
                to_node=int(mine.get("to", 0)),
            )
    return sorted(out.values(), key=lambda n: (-(n.last_heard or 0.0), n.id))


def _num(*values: Any) -> float | None:
    for v in values:
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
