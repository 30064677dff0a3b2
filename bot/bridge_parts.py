"""The bridge's bookkeeping (``bot.bridge``): sliding rate windows, the table of relayed
messages known on both sides, and digest pages.

Invariants: a ``Window`` counts events per key in the last ``seconds`` and forgets idle keys;
``Links`` holds at most ``size`` relayed messages (oldest forgotten first) and finds each by
its Discord id or its mesh packet id; ``pages`` never returns a page over ``DISCORD_POST``
characters.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from bot.domain import Delivery

LINKS = 4096  # relayed messages whose Discord and mesh ids are remembered (replies, reactions)
SNIPPET_CHARS = 60  # of the original text, in a webhook reply's quote line
DISCORD_POST = 2000  # Discord's characters per message


class Window:
    """At most ``count`` events per ``seconds`` per key (sliding window)."""

    def __init__(self, count: int, seconds: float) -> None:
        self.count, self.seconds = count, seconds
        self._stamps: dict[object, deque[float]] = {}

    def full(self, key: object, now: float) -> bool:
        stamps = self._stamps.setdefault(key, deque())
        while stamps and now - stamps[0] >= self.seconds:
            stamps.popleft()
        if not stamps:
            del self._stamps[key]  # keep the table as small as the set of active keys
            return False
        return len(stamps) >= self.count

    def note(self, key: object, now: float) -> None:
        self._stamps.setdefault(key, deque()).append(now)

    def free_in(self, key: object, now: float) -> float:
        """Seconds until ``key`` has room again (0 when it has room now)."""
        stamps = self._stamps.get(key)
        if not stamps or len(stamps) < self.count:
            return 0.0
        return max(0.0, stamps[0] + self.seconds - now)


def pages(head: str, lines: list[str]) -> list[str]:
    """``head`` and ``lines`` in as few posts of at most ``DISCORD_POST`` characters as fit."""
    pages: list[str] = []
    page = head
    for line in lines:
        line = line if len(line) <= DISCORD_POST - 10 else line[: DISCORD_POST - 11] + "…"
        if len(page) + 1 + len(line) > DISCORD_POST:
            pages.append(page)
            page = head
        page += "\n" + line
    pages.append(page)
    return pages


@dataclass(frozen=True, slots=True)
class Link:
    discord_channel: int
    discord_message: int
    mesh_channel: int
    packet_id: int
    snippet: str  # "name: first words", for a quote line


class Links:
    """The last ``LINKS`` relayed messages, found by either side's id."""

    def __init__(self, size: int = LINKS) -> None:
        self._size = size
        self._by_discord: OrderedDict[tuple[int, int], Link] = OrderedDict()
        self._by_mesh: dict[tuple[int, int], list[Link]] = {}

    def add(self, link: Link) -> None:
        self._by_discord[(link.discord_channel, link.discord_message)] = link
        self._by_mesh.setdefault((link.mesh_channel, link.packet_id), []).append(link)
        while len(self._by_discord) > self._size:
            _, old = self._by_discord.popitem(last=False)
            same = self._by_mesh.get((old.mesh_channel, old.packet_id), [])
            if old in same:
                same.remove(old)
            if not same:
                self._by_mesh.pop((old.mesh_channel, old.packet_id), None)

    def discord(self, channel_id: int, message_id: int) -> Link | None:
        return self._by_discord.get((channel_id, message_id))

    def mesh(self, channel: int, packet_id: int) -> list[Link]:
        return list(self._by_mesh.get((channel, packet_id), ()))


def snippet(name: str, text: str) -> str:
    words = " ".join(text.split())
    cut = words[:SNIPPET_CHARS] + ("…" if len(words) > SNIPPET_CHARS else "")
    return f"{name}: {cut}"


def first_id(delivery: Delivery) -> int | None:
    try:
        return int(delivery.message_ids[0]) if delivery.message_ids else None
    except ValueError:
        return None
