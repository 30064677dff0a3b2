"""Mesh holds: how many replies fit, why they wait, and the airtime rules at each write.

``MeshtasticTransport`` mixes it in (under the outbox, ``meshtastic_outbox.py``, whose docstring
states the sending model) together with the link (``meshtastic_link.py``).

Invariants:
- ``busy()`` names the true cause first: a hold of answers by the pacer (``"duty"``: the hourly
  airtime is spent; ``"channel"``: the others fill the channel) before a full queue
  (``outbox_limit`` replies not started, one-packet notices not counted, nor replies to
  unconfirmed senders the allowance no longer covers: those end without airtime), with an
  estimate and
  whether a one-packet notice may still go out (the pacer's rule for urgent packets).
- A job held by the pacer keeps the time it was first held (``_Job.held_since``); it ends
  ``PENDING`` ``busy_max_wait`` later, wherever it waits (queued or between its parts).
- Device metrics the radio reports go to the pacer with the time they arrived; the log says
  once when a radio reports none at connect and when a report expires (the radio stopped).
- Hold starts and ends are logged once each, with the figures, never per packet.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from dataclasses import dataclass, field

from bot.config import MeshtasticConfig
from bot.domain import Delivery, DeliveryStatus, Reply, ReplyKind
from bot.transports.base import Busy
from bot.transports.mesh_airtime import Metrics, Pacer, lora_airtime
from bot.transports.mesh_rules import Clock
from bot.transports.mesh_strangers import Standing, Strangers
from bot.transports.meshtastic_link import MeshLink

log = logging.getLogger("bot.transport.meshtastic")

NOTICE_BYTES = 80  # a typical one-packet notice, for "can a notice still go out?"
# The firmware retransmits a want_ack packet that gets no ACK up to 3 times (NUM_RELIABLE_RETX
# in the firmware's ReliableRouter) before it reports MAX_RETRANSMIT.
FIRMWARE_RETRANSMISSIONS = 3


@dataclass
class _Part:
    index: int
    text: str
    state: str = "todo"  # todo | flying | missing | ack | relayed | sent | done | failed
    pid: int | None = None
    sent_at: float = 0.0
    sends: int = 0
    relayed: bool = False
    reason: str = ""
    packet_id: int | None = None  # planned before the first write; every send repeats it
    repeat: bool = False  # the id was planned by an earlier run: it may be on air already
    writing: bool = False  # from the library write until the part is recorded (see _send_burst)
    charge: int = 0  # the stranger allowance's token for its last write (0: none pending)


@dataclass
class _Job:
    reply: Reply
    person: str
    dest: int
    channel: int
    want_ack: bool
    parts: list[_Part]
    enqueued_at: float
    future: asyncio.Future[Delivery]
    started: bool = False
    cost: int = 0  # transmissions charged, firmware retransmissions included
    resend_at: float = 0.0
    ids: list[str] = field(default_factory=list)
    relay: bool = False  # relayed bridge text (never urgent)
    tapback: bool = False  # a relayed reaction: the emoji flag set, ``reply_id`` its target
    held_since: float | None = None  # when the pacer first held this job (busy_max_wait)

    @property
    def urgent(self) -> bool:
        """A one-packet notice ("busy", "unavailable"): it goes before waiting answers and
        may use the notice reserve of the airtime rules."""
        return self.reply.kind is ReplyKind.NOTICE and len(self.parts) == 1 and not self.relay

    def waiting(self) -> bool:
        return any(p.state == "flying" for p in self.parts)

    def missing(self) -> list[_Part]:
        return [p for p in self.parts if p.state == "missing"]


class MeshHolds(MeshLink):
    """The capacity and airtime half of the outbox (state is set up in the transport)."""

    _cfg: MeshtasticConfig
    _clock: Clock
    _jobs: list[_Job]
    _jobs_changed: asyncio.Event
    _last_tx: float
    _pacer: Pacer
    _metrics_said: bool
    _held: str
    _hold_reason: str  # "duty"/"hold" while answers are held ("" otherwise), for the log
    _hold_started: float
    _stale_said: bool
    _holds: Counter[str]  # holds started, by cause (the operator's view)
    _holding: str  # why a part is held right now ("" when none is)
    _strangers: Strangers

    def _finish(self, job: _Job, delivery: Delivery) -> None:
        raise NotImplementedError

    def _standing(self, job: _Job) -> Standing:
        raise NotImplementedError

    def _worst(self, job: _Job, part: _Part) -> float:
        """Seconds on air one write of ``part`` costs at its worst (never ACKed)."""
        return self._airtime(part) * (1 + (FIRMWARE_RETRANSMISSIONS if job.want_ack else 0))

    def _queued(self, now: float) -> list[_Job]:
        """Replies not started that will go on air (``busy``): those to unconfirmed senders
        only as far as the allowance still covers them (the rest end without airtime)."""
        room = self._strangers.allowance.room(now)
        out = []
        for job in self._jobs:
            if job.started or job.urgent:
                continue
            if self._standing(job) is not Standing.CONFIRMED:
                worst = sum(self._worst(job, p) for p in job.parts if p.state == "todo")
                if worst > room:
                    continue
                room -= worst
            out.append(job)
        return out

    # --- capacity ------------------------------------------------------------------------------
    def busy(self) -> Busy | None:
        """None when a new reply can be queued; else why not and roughly for how long. A hold
        (duty cycle, busy channel) comes first: it is the true cause even when replies queue
        up behind it."""
        now = self._clock.monotonic()
        hold = self._pacer.hold_estimate(
            now, lora_airtime(self._cfg.chunk_bytes, preset=self._preset)
        )
        if hold is not None:
            notice = self._pacer.hold_estimate(
                now, lora_airtime(NOTICE_BYTES, preset=self._preset), urgent=True
            )
            return Busy(
                cause="duty" if hold.reason == "duty" else "channel",
                seconds=hold.seconds,
                notice_now=notice is None,
            )
        waiting = self._queued(now)
        if len(waiting) < self._cfg.outbox_limit:
            return None
        packets = sum(len(j.parts) for j in waiting)
        return Busy(
            cause="queue", seconds=packets * self._cfg.spacing_seconds + self._cfg.ack_timeout
        )

    def busy_for(self) -> float | None:
        """None when a new reply can be queued; else roughly when there will be room."""
        busy = self.busy()
        return None if busy is None else busy.seconds

    # --- device metrics -----------------------------------------------------------------------
    @property
    def _preset(self) -> str:
        return self._cfg.modem_preset

    def _metrics_at_connect(self, metrics: Metrics) -> None:
        if metrics.channel_utilization is None and metrics.air_util_tx is None:
            if not self._metrics_said:
                self._metrics_said = True
                log.warning(
                    "the radio reports no device metrics (channelUtilization, airUtilTx: older "
                    "firmware?); pacing by spacing_seconds (%.1f s) and the bot's own airtime "
                    "(duty_cycle %.0f%%) only, without the channel rule",
                    self._cfg.spacing_seconds,
                    self._cfg.duty_cycle,
                )
            return
        self._metrics_in(metrics)
        log.info(
            "radio metrics: channel %.1f%%, own TX %.1f%% of the hour; pacing to channel %.0f%%, "
            "duty cycle %.0f%%",
            metrics.channel_utilization or 0.0,
            metrics.air_util_tx or 0.0,
            self._cfg.busy_threshold,
            self._cfg.duty_cycle,
        )

    def _metrics_in(self, metrics: Metrics) -> None:
        if metrics.channel_utilization is None and metrics.air_util_tx is None:
            return
        self._pacer.note_metrics(metrics, self._clock.monotonic())
        self._jobs_changed.set()  # a held reply may go now

    def _hold_state(self, now: float, *, urgent: bool) -> tuple[str, float]:
        """("duty"/"hold", when to look again) while the pacer holds such packets, else
        ("", inf). Logs when a hold of answers starts and ends."""
        size = NOTICE_BYTES if urgent else self._cfg.chunk_bytes
        verdict = self._pacer.wait(
            now, lora_airtime(size, preset=self._preset), last=self._last_tx, urgent=urgent
        )
        reason = verdict.reason if verdict.reason in ("hold", "duty") else ""
        if not urgent and (self._jobs or self._hold_reason):
            self._note_hold(now, reason)
        self._note_stale(now)
        if not reason:
            return "", math.inf
        return reason, now + min(verdict.wait, self._cfg.busy_poll)

    def _note_hold(self, now: float, reason: str) -> None:
        if reason and not self._hold_reason:
            self._hold_reason, self._hold_started = reason, now
            log.info("%s; holding replies, one-packet notices still go while the rules allow "
                     "(%s)", _why(reason), self._figures(now))  # fmt: skip
        elif not reason and self._hold_reason:
            log.info("room on the channel again after %.0f s (%s); sending held replies",
                     now - self._hold_started, _why(self._hold_reason))  # fmt: skip
            self._hold_reason = ""
        elif reason:
            self._hold_reason = reason

    def _note_stale(self, now: float) -> None:
        stale = self._pacer.stale(now)
        if stale and not self._stale_said:
            log.warning("no device metrics from the radio for over %.0f s; the last report "
                        "no longer counts: pacing by spacing and the bot's own airtime",
                        self._pacer.metrics_max_age)  # fmt: skip
        self._stale_said = stale

    def _keep_held(self, job: _Job, now: float, reason: str) -> float:
        """Keep a held job queued until ``busy_max_wait``; then it ends ``PENDING``. Returns
        when to look at it again."""
        if job.held_since is None:
            job.held_since = now
        deadline = job.held_since + self._cfg.busy_max_wait
        if now < deadline:
            return deadline
        detail = f"held {now - job.held_since:.0f} s: {_why(reason)}"
        log.info("%s for %.0f s; the reply to %s is handed back as pending", _why(reason),
                 now - job.held_since, job.person)  # fmt: skip
        self._finish(
            job, Delivery(DeliveryStatus.PENDING, message_ids=tuple(job.ids), detail=detail)
        )
        return math.inf

    def _airtime(self, part: _Part) -> float:
        return lora_airtime(len(part.text.encode("utf-8")), preset=self._preset)

    async def _pace(self, job: _Job, part: _Part) -> bool:
        """Wait until the pacer lets this part go. False when it was held (channel busy or
        duty cycle spent) for ``busy_max_wait``: the reply then goes back to the outbox."""
        try:
            return await self._pace_part(job, part)
        finally:
            self._holding = ""  # (the operator's view: nothing is held once this returns)

    async def _pace_part(self, job: _Job, part: _Part) -> bool:
        urgent = job.urgent
        airtime = self._airtime(part)
        held_since: float | None = job.held_since
        while True:
            now = self._clock.monotonic()
            verdict = self._pacer.wait(now, airtime, last=self._last_tx, urgent=urgent)
            if verdict.wait <= 0:
                if held_since is not None:
                    log.info("channel has room again after %.0f s; sending", now - held_since)
                return True
            if verdict.reason in ("hold", "duty"):
                self._holding = _why(verdict.reason)
                if held_since is None:
                    held_since = job.held_since = now
                    self._holds[verdict.reason] += 1
                    log.info("%s; holding the reply to %s (%s)", _why(verdict.reason),
                             job.person, self._figures(now))  # fmt: skip
                if now - held_since >= self._cfg.busy_max_wait:
                    self._held = f"held {now - held_since:.0f} s: {_why(verdict.reason)}"
                    log.info("%s for %.0f s; the reply to %s is handed back as pending",
                             _why(verdict.reason), now - held_since, job.person)  # fmt: skip
                    return False
                step = min(verdict.wait, held_since + self._cfg.busy_max_wait - now)
                await self._wait(self._jobs_changed, max(step, 0.001))
                self._jobs_changed.clear()
                continue
            await self._clock.sleep(verdict.wait)

    def _figures(self, now: float) -> str:
        m = self._pacer.fresh(now)
        util = "n/a" if m.channel_utilization is None else f"{m.channel_utilization:.1f}%"
        tx = "" if m.air_util_tx is None else f", node TX {m.air_util_tx:.1f}% of the hour"
        return (
            f"channel {util}{tx}, bot {self._pacer.own_share(now, 3600):.1f}% of the hour, limits "
            f"{self._cfg.busy_threshold:.0f}% / {self._cfg.duty_cycle:.0f}%"
        )


def _why(reason: str) -> str:
    return {
        "hold": "channel busy with other nodes' traffic",
        "duty": "the bot's hourly airtime (duty cycle) is spent",
    }.get(reason, reason)
