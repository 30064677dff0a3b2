"""Mesh airtime: LoRa time on air and the pacing rule that keeps the bot a good neighbour.

Pure (no meshtastic import, no I/O): the transport feeds it the radio's device metrics and
its own writes, on an injected clock, and asks how long to wait before the next packet.

Invariants:
- ``lora_airtime`` is Semtech's time-on-air formula for the Meshtastic modem presets
  (16-symbol preamble, explicit header, CRC on, low-data-rate optimisation at SF11+/125 kHz);
  a text packet carries the payload plus ~22 bytes of header and protobuf.
- The bot's own airtime is kept in a ledger of its writes (time, seconds on air) for one hour.
  Its hourly share is the radio's ``airUtilTx`` when the radio reported it recently (it counts
  every transmission of the node: relays and retransmissions too), else the ledger's sum / 3600.
- A device-metrics report expires ``metrics_max_age`` seconds after it arrived (the firmware
  sends one a minute): a stale figure never holds the bot. Without a fresh report the channel
  rule is off and the duty cycle is the bot's own ledger, so a radio that stops reporting (or
  never reported: old firmware) can never freeze the bot.
- ``Pacer.wait`` never returns less than ``spacing`` after the previous write. Above that:
  * duty cycle: answers stop at ``duty_cycle`` minus a reserve (``NOTICE_RESERVE`` of it) and
    one-packet notices ("urgent") stop only where the firmware itself refuses every packet
    (``Router::send``: the node's hourly TX share *over* the region's duty cycle, answered with
    a ``DUTY_CYCLE_LIMIT`` NAK), so a person asking while answers are held can still be told
    why; nothing is written until the ledger frees room (or ``poll`` later, when the radio's
    figure is used). Notices are in the ledger like answers;
  * channel: with the radio's ``channelUtilization`` (its last minute, the bot's own packets
    included) the others' part is estimated as reported - the bot's own last-minute share;
    the bot then spaces its packets so its own share stays within ``channel_limit`` - others
    (longer spacing: packets ``airtime / room`` apart, and no minute holding more); when
    the others alone reach ``channel_limit``, non-urgent parts are held (re-checked every
    ``poll``); urgent ones go whenever others + the bot's own last minute (every packet,
    answers and notices, this one included) stay within ``FIRMWARE_CHANNEL_LIMIT`` (the
    firmware's ``max_channel_util_percent``, 40: above it even the firmware's own replies to
    other nodes stop; its background sends stop at the polite 25). The firmware does not gate
    a client's text by channel use at all; 40 is courtesy, the point where the node itself
    goes quiet: people asking while answers are held hear why promptly;
  * without fresh device metrics the channel rule is off: spacing and the bot's own duty cycle
    (from its ledger) still apply; the transport says so.
- ``hold_estimate`` says how long a hold will likely last and why (``Hold``): for a reported
  ``airUtilTx`` over the limit, the time for the hour to age that excess out if the node sent
  nothing more; for the ledger, when enough of it ages out; for a busy channel, a minute.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

HOUR = 3600.0
CHANNEL_WINDOW = 60.0  # the firmware's channelUtilization covers about the last minute
FIRMWARE_CHANNEL_LIMIT = 40.0  # max_channel_util_percent: above it the node sends nothing itself
FIRMWARE_POLITE_LIMIT = 25.0  # polite_channel_util_percent: its background sends stop above it
RESOLUTION = 0.001  # shorter waits of the channel rule are rounding (float32 metrics): go now
CRUMB = 1e-6  # the shortest spacing wait (float sums of times may fall a crumb short)
PACKET_OVERHEAD = 22  # header (16) + protobuf framing of a text packet (~6)
METRICS_MAX_AGE = 180.0  # three missed one-minute reports: the figure no longer describes now
NOTICE_RESERVE = 0.1  # share of the duty cycle kept for one-packet notices (EU: 36 s an hour)

# (spreading factor, bandwidth Hz, coding rate denominator - 4) per Meshtastic modem preset
PRESETS: dict[str, tuple[int, float, int]] = {
    "LONG_FAST": (11, 250e3, 1),
    "LONG_MODERATE": (11, 125e3, 4),
    "LONG_SLOW": (12, 125e3, 4),
    "MEDIUM_SLOW": (10, 250e3, 1),
    "MEDIUM_FAST": (9, 250e3, 1),
    "SHORT_SLOW": (8, 250e3, 1),
    "SHORT_FAST": (7, 250e3, 1),
}


def lora_airtime(payload: int, *, preset: str = "LONG_FAST") -> float:
    """Seconds on air of one text packet carrying ``payload`` bytes."""
    sf, bw, cr = PRESETS[preset]
    t_sym = (2**sf) / bw
    low_rate = 1 if t_sym > 0.016 else 0  # LDRO: symbols longer than 16 ms
    size = payload + PACKET_OVERHEAD
    n = 8 + max(math.ceil((8 * size - 4 * sf + 28 + 16) / (4 * (sf - 2 * low_rate))) * (cr + 4), 0)
    return float((16 + 4.25) * t_sym + n * t_sym)


@dataclass(frozen=True)
class Metrics:
    """The local node's device metrics (percent), as the radio last reported them."""

    channel_utilization: float | None = None
    air_util_tx: float | None = None


@dataclass(frozen=True)
class Verdict:
    wait: float  # seconds before the next write may start (0: now)
    reason: str  # "" (normal spacing), "slow", "hold", "duty"


@dataclass(frozen=True)
class Hold:
    """Why answers are held and for about how long."""

    reason: str  # "duty" (the hourly airtime is spent) or "hold" (other nodes fill the channel)
    seconds: float


class Pacer:
    def __init__(
        self,
        *,
        spacing: float,
        channel_limit: float,
        duty_cycle: float,
        poll: float,
        metrics_max_age: float = METRICS_MAX_AGE,
    ) -> None:
        self.spacing = spacing
        self.channel_limit = channel_limit
        self.duty_cycle = duty_cycle
        self.poll = poll
        self.metrics_max_age = metrics_max_age
        self.metrics = Metrics()  # the last report, fresh or not (see ``fresh``)
        self._ledger: deque[tuple[float, float]] = deque()  # (start of write, seconds on air)
        self._last_end = -math.inf
        self._metrics_at = -math.inf

    # --- inputs ------------------------------------------------------------------------------
    def wrote(self, at: float, airtime: float) -> None:
        """The bot wrote a packet at ``at`` that takes ``airtime`` seconds on air."""
        self._ledger.append((at, airtime))
        self._last_end = max(self._last_end, at)
        self._prune(at)

    def note_metrics(self, metrics: Metrics, at: float) -> None:
        """The radio reported ``metrics`` at ``at`` (they describe the minute before it)."""
        self.metrics = metrics
        self._metrics_at = at

    # --- figures ------------------------------------------------------------------------------
    def fresh(self, now: float) -> Metrics:
        """The last report while it is at most ``metrics_max_age`` old, else no metrics."""
        if now - self._metrics_at > self.metrics_max_age:
            return Metrics()
        return self.metrics

    def stale(self, now: float) -> bool:
        """A report was received once but has expired (the radio stopped reporting)."""
        return self._metrics_at > -math.inf and now - self._metrics_at > self.metrics_max_age

    def expires_in(self, now: float) -> float:
        """Seconds until the current report expires (inf when there is none to expire)."""
        if self._metrics_at == -math.inf:
            return math.inf
        left = self._metrics_at + self.metrics_max_age - now
        return left if left > 0 else math.inf

    def own_share(self, now: float, window: float) -> float:
        """Percent of the ``window`` seconds before ``now`` the bot's own writes were on air."""
        used = sum(a for t, a in self._ledger if now - window <= t <= now)
        return 100.0 * used / window

    def hourly_share(self, now: float) -> float:
        """The bot's (or, when reported, the node's) TX share of the last hour, percent."""
        self._prune(now)
        own = self.own_share(now, HOUR)
        reported = self.fresh(now).air_util_tx
        return own if reported is None else max(own, reported)

    def others(self, now: float) -> float | None:
        """The channel share other nodes take (estimate), or None without fresh metrics."""
        util = self.fresh(now).channel_utilization
        if util is None:
            return None
        # the report covers the minute before it was made: subtract the bot's share of *that*
        # minute (a stale report must not count the bot's own aged-out packets as others')
        return max(0.0, util - self.own_share(self._metrics_at, CHANNEL_WINDOW))

    # --- the rule ------------------------------------------------------------------------------
    def wait(self, now: float, airtime: float, *, last: float, urgent: bool = False) -> Verdict:
        """How long before a packet of ``airtime`` seconds may start, ``last`` being the end of
        the previous write (module docstring)."""
        self._last_end = last
        base = self.spacing - (now - self._last_end)
        # never early (the firmware drops a text within 2 s of the last): a crumb of a wait is
        # waited out, at least ``CRUMB`` so the clock moves on
        base = 0.0 if base <= 0 else max(base, CRUMB)
        duty = self._duty_wait(now, airtime, urgent=urgent)
        if duty > 0:
            return Verdict(max(base, duty), "duty")
        others = self.others(now)
        if others is None:
            return Verdict(base, "")
        if urgent:  # a one-packet notice: the bot's last minute within the firmware's limit
            room = FIRMWARE_CHANNEL_LIMIT - others
            if airtime > room * CHANNEL_WINDOW / 100.0:  # no room even for this one packet
                return Verdict(max(base, self.poll), "hold")
            slow = self._window_wait(now, airtime, room)
            return Verdict(max(base, slow), "slow" if slow > base else "")
        room = self.channel_limit - others
        if room <= 0:
            return Verdict(max(base, self.poll), "hold")
        # Own share in the channel window must stay <= room: space writes by airtime / room,
        # and never let the last minute (this packet included) hold more than room allows.
        gap = airtime * 100.0 / room
        slow = max(gap - (now - self._last_end), self._window_wait(now, airtime, room))
        if slow > base and slow >= RESOLUTION:
            return Verdict(slow, "slow")
        return Verdict(base, "")

    def hold_estimate(self, now: float, airtime: float, *, urgent: bool = False) -> Hold | None:
        """Why a held (non-urgent, unless ``urgent``) packet waits, and roughly how long; None
        when it would not be held."""
        duty = self._duty_wait(now, airtime, urgent=urgent)
        if duty > 0:
            share = self._share_limit(urgent)
            reported = self.fresh(now).air_util_tx
            if reported is not None and reported >= share:
                # the hour ages the excess out (if the node sent nothing more), at least a poll
                duty = max(self.poll, HOUR * (reported - share) / reported, duty)
            return Hold("duty", duty)
        others = self.others(now)
        limit = FIRMWARE_CHANNEL_LIMIT if urgent else self.channel_limit
        if others is not None and others >= limit:
            return Hold("hold", max(self.poll, CHANNEL_WINDOW))
        return None

    def _share_limit(self, urgent: bool) -> float:
        """The hourly share (percent) a packet may go up to: notices use the reserve."""
        return self.duty_cycle if urgent else self.duty_cycle * (1.0 - NOTICE_RESERVE)

    def _duty_wait(self, now: float, airtime: float, *, urgent: bool = False) -> float:
        share = self._share_limit(urgent)
        limit = share * HOUR / 100.0  # seconds on air per hour
        reported = self.fresh(now).air_util_tx
        # answers stop at their share; notices only over the duty cycle (the firmware's rule)
        if reported is not None and (reported > share if urgent else reported >= share):
            # the radio's own hourly figure: re-check when it updates (or expires)
            return min(self.poll, self.expires_in(now))
        self._prune(now)
        used = sum(a for _, a in self._ledger)
        if used + airtime <= limit:
            return 0.0
        # the earliest moment enough of the ledger has aged out of the hour
        excess = used + airtime - limit
        for t, a in self._ledger:
            excess -= a
            if excess <= 0:
                return max(RESOLUTION, t + HOUR - now)
        return HOUR

    def _window_wait(self, now: float, airtime: float, room: float) -> float:
        """Seconds until the bot's writes of the last ``CHANNEL_WINDOW`` plus this packet fit
        ``room`` percent of the window."""
        budget = room * CHANNEL_WINDOW / 100.0
        recent = [(t, a) for t, a in self._ledger if t > now - CHANNEL_WINDOW]
        excess = sum(a for _, a in recent) + airtime - budget
        for t, a in recent:
            if excess <= 0:
                break
            excess -= a
            if excess <= 0:
                return max(0.0, t + CHANNEL_WINDOW - now)
        return 0.0 if excess <= 0 else CHANNEL_WINDOW

    def _prune(self, now: float) -> None:
        while self._ledger and self._ledger[0][0] < now - HOUR:
            self._ledger.popleft()
