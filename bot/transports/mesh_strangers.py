"""Mesh strangers: what a sender the bot cannot confirm may cost it on air (issue 44.8).

Pure (no meshtastic import, no I/O but its log lines): the outbox asks it, on its injected
clock, how far it trusts whom a reply goes to, how many re-sends that person gets and whether
the shared hourly allowance still covers the reply.

A packet's ``from`` is whatever its sender wrote, so anyone can invent a new node id with
every packet, and per-person limits cost such a flood nothing. Invariants:
- ``Standing``: ``CONFIRMED`` (the node ACKed a packet of the bot: a radio that exists and
  hears us), ``KNOWN`` (the question was authenticated, or the radio holds its NodeInfo or
  public key, never confirmed), ``STRANGER`` (neither: the radio never heard who it is). An
  authenticated sender is only KNOWN: keys are pinned on first use, so a flood can mint a
  key for every id it invents; only an ACK proves a radio that exists. The outbox
  decides the standing in ONE place (``MeshOutbox._standing``) and serves a stranger's reply
  after everyone else's (``rank``) until it has waited ``STRANGER_WAIT``, then in its turn:
  a burst of invented senders cannot delay a known person, and a real newcomer is not
  starved by a busy hour.
- A ``STRANGER`` gets ``stranger_retries`` re-sends (default 0: its first write only, with
  the firmware's own retransmissions), the others ``ack_retries``.
- Every reply to an unconfirmed sender (``KNOWN`` or ``STRANGER``; notices too: a notice is
  airtime) is charged to one shared ``Allowance``: ``stranger_share`` percent of the hour's
  duty-cycle airtime, counting the airtime spent on writes nobody confirmed. A write is
  charged its time on air; the firmware's retransmissions are added when it ends without an
  ACK (``MAX_RETRANSMIT``, no answer), as the per-reply ``airtime_budget`` counts them; an ACK
  from its destination forgives the charge (the node exists: a real newcomer costs the
  allowance nothing). A reply (or re-send) the allowance cannot cover at its worst (every
  write unanswered) is not sent: it ends FAILED, without a notice to its sender (that would
  spend the airtime the flood is after). Confirmed people are never charged, so a flood takes
  at most ``stranger_share`` of the bot's hour, plus the retransmissions of the writes still
  waiting for their answer when it was reached.
- ``confirmed`` is bounded (``CONFIRMED_NODES``, least recently confirmed dropped first) and
  lives in memory: after a restart a person is confirmed again by their first ACK.
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from bot.transports.mesh_airtime import HOUR

log = logging.getLogger("bot.transport.meshtastic")

CONFIRMED_NODES = 4096
STRANGER_WAIT = 120.0  # a stranger's reply waits behind everyone else's at most this long


class Standing(enum.IntEnum):
    """How far the bot trusts a sender (the outbox's order is ``rank``)."""

    CONFIRMED = 0
    KNOWN = 1
    STRANGER = 2


def standing(*, authenticated: bool, acked: bool, known: bool) -> Standing:
    """The standing of a sender from what the bot knows of it (module docstring)."""
    if acked:
        return Standing.CONFIRMED
    return Standing.KNOWN if known or authenticated else Standing.STRANGER


def rank(who: Standing, waited: float) -> int:
    """The outbox's order: 0 first (everyone, and a stranger's reply that waited
    ``STRANGER_WAIT``), then 1 (a stranger's younger reply); FIFO within each."""
    return 1 if who is Standing.STRANGER and waited < STRANGER_WAIT else 0


def known_node(table: Any, num: int) -> bool:
    """Whether the node DB (the library's ``nodesByNum``) holds node ``num``'s own NodeInfo or
    public key, not the placeholder the library makes up for a node it only heard a packet
    from (long name "Meshtastic abcd", the id's last four digits)."""
    try:
        entry = table.get(num) if isinstance(table, Mapping) else None
    except (AttributeError, RuntimeError):  # the library's thread may be writing it
        return False
    if not isinstance(entry, Mapping):
        return False
    user = entry.get("user")
    if not isinstance(user, Mapping):
        return False
    if user.get("publicKey"):
        return True
    name = user.get("longName")
    return isinstance(name, str) and bool(name) and name != f"Meshtastic {num & 0xFFFF:04x}"


class Allowance:
    """Seconds on air per rolling hour for replies to unconfirmed senders, charged per write;
    a charge is a token that a later cost of the same write (retransmissions) is added to."""

    def __init__(self, *, seconds_per_hour: float) -> None:
        self.seconds_per_hour = seconds_per_hour
        self._charges: OrderedDict[int, tuple[float, float]] = OrderedDict()  # token: (t, s)
        self._tokens = itertools.count(1)

    def used(self, now: float) -> float:
        while self._charges:
            token, (at, _) = next(iter(self._charges.items()))
            if at >= now - HOUR:
                break
            del self._charges[token]
        return sum(s for _, s in self._charges.values())

    def covers(self, now: float, seconds: float) -> bool:
        return self.used(now) + seconds <= self.seconds_per_hour + 1e-9

    def charge(self, now: float, seconds: float) -> int:
        token = next(self._tokens)
        self._charges[token] = (now, seconds)
        return token

    def add(self, token: int, seconds: float) -> None:
        """Add ``seconds`` to the charge ``token`` (gone already: it aged out of the hour)."""
        charge = self._charges.get(token)
        if charge is not None:
            self._charges[token] = (charge[0], charge[1] + seconds)

    def forgive(self, token: int) -> None:
        """The write ``token`` was confirmed: it costs the allowance nothing."""
        charge = self._charges.get(token)
        if charge is not None:
            self._charges[token] = (charge[0], 0.0)

    def room(self, now: float) -> float:
        return max(0.0, self.seconds_per_hour - self.used(now))


class Strangers:
    """The policy's state: nodes that confirmed themselves, the allowance, refusals."""

    def __init__(self, *, allowance: Allowance, stranger_retries: int) -> None:
        self.allowance = allowance
        self.stranger_retries = stranger_retries
        self._confirmed: OrderedDict[int, None] = OrderedDict()
        self.refused = 0  # replies not sent since start (the operator's view)
        self.spent_since: float | None = None  # when the allowance was found spent (episode)
        self.refused_in_episode = 0

    def confirm(self, num: int) -> None:
        """``num`` ACKed a packet of the bot."""
        self._confirmed[num] = None
        self._confirmed.move_to_end(num)
        while len(self._confirmed) > CONFIRMED_NODES:
            self._confirmed.popitem(last=False)

    def acked(self, num: int) -> bool:
        return num in self._confirmed

    def retries(self, who: Standing, ack_retries: int) -> int:
        return min(ack_retries, self.stranger_retries) if who is Standing.STRANGER else ack_retries

    def admit(self, now: float, worst: float) -> bool:
        """Whether the allowance covers a reply costing ``worst`` seconds at most; a refusal is
        counted, and the operator told once per episode (and when room returns)."""
        if self.allowance.covers(now, worst):
            if self.spent_since is not None:
                log.info("room again for replies to unconfirmed senders; %d were not sent",
                         self.refused_in_episode)  # fmt: skip
                self.spent_since, self.refused_in_episode = None, 0
            return True
        self.refused += 1
        self.refused_in_episode += 1
        if self.spent_since is None:
            self.spent_since = now
            log.warning("replies to unconfirmed senders (never ACKed, not authenticated) spent "
                        "their airtime: %.0f of %.0f s this hour (stranger_share of the duty "
                        "cycle); further ones are not sent, without a notice, until the hour "
                        "frees room; confirmed people are served as before",
                        self.allowance.used(now), self.allowance.seconds_per_hour)  # fmt: skip
        return False
