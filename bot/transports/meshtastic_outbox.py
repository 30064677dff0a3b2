"""The Meshtastic outbox: fair, paced sending of replies and the ACK bookkeeping.

``MeshtasticTransport`` mixes it in with the link (``meshtastic_link.py``).

The sending model (docs/reliability.md and docs/meshtastic.md explain it for operators):
- The unit on air is a *burst*: consecutive parts of ONE reply, each at least
  ``spacing_seconds`` after the previous packet (measured on the injected clock from the end
  of one write to the start of the next). Two people's parts never interleave inside a burst.
- Waiting for ACKs does not hold the radio. As soon as a reply's burst is written, the next
  burst may start: re-sends whose backoff has passed first (oldest reply first), then the next
  new reply whose person is out of ``cooldown``. A reply's re-send is one burst of its missing
  parts, started only when none of its parts is still waiting for an answer.
- A DM part is *delivered* by an ACK from its destination; an ACK relayed by another node
  (implicit ACK) means "on the mesh": no re-send, reported as SENT. A NAK is re-sent only for
  reasons a re-send can fix (``RESENDABLE``: no route yet, retransmissions exhausted, duty
  cycle or rate limit, timeouts); others (no channel, PKI failure, too large...) fail the part
  at once. No answer within ``ack_timeout`` counts as a failed delivery and may be re-sent;
  this also catches a part the library dropped while silently re-opening its TCP link
  (it returns a packet id for a write that never reached the radio).
- Airtime budget per reply (``airtime_budget``, in packet transmissions): every write costs 1,
  and a part that ended without an ACK (``MAX_RETRANSMIT`` or no answer) also costs the
  firmware's own ``FIRMWARE_RETRANSMISSIONS``. A re-send burst goes out only if the budget
  covers it at its worst (each re-sent part again 1 + firmware retransmissions), and each part
  is re-sent at most ``ack_retries`` times, after ``ack_backoff`` doubling per attempt.
- Broadcasts (channel replies) get no ACK, so they are written only on a link *known* to be up:
  a packet from the node within ``KNOWN_UP_SECONDS``, else a probe answered first.
- Every part the library accepted is reported to the durable outbox (``reply.progress``)
  before the next is written; parts listed in ``reply.done_parts`` (sent by an earlier run)
  are skipped. A reply that could not get a link for ``queue_wait`` seconds ends ``PENDING``
  (the responder's outbox tries again later); so do replies waiting at ``stop``.
- ``busy_for`` tells the responder when new replies would wait too long (``outbox_limit``
  replies not started yet), so the LLM is not asked for an answer that cannot be sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.config import MeshtasticConfig
from bot.domain import Delivery, DeliveryStatus, Reply
from bot.transports.mesh_rules import Clock, Cooldown
from bot.transports.meshtastic_link import MeshLink, RadioInterface

log = logging.getLogger("bot.transport.meshtastic")

# The firmware retransmits a want_ack packet that gets no ACK up to 3 times (NUM_RELIABLE_RETX
# in the firmware's ReliableRouter) before it reports MAX_RETRANSMIT.
FIRMWARE_RETRANSMISSIONS = 3
RESENDABLE = frozenset(
    {
        "MAX_RETRANSMIT",
        "NO_ROUTE",
        "GOT_NAK",
        "TIMEOUT",
        "NO_RESPONSE",
        "NO_INTERFACE",
        "DUTY_CYCLE_LIMIT",
        "RATE_LIMIT_EXCEEDED",
    }
)
KNOWN_UP_SECONDS = 60.0
NO_ACK = "no ACK"


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

    def waiting(self) -> bool:
        return any(p.state == "flying" for p in self.parts)

    def missing(self) -> list[_Part]:
        return [p for p in self.parts if p.state == "missing"]


class MeshOutbox(MeshLink):
    """The outbox half of ``MeshtasticTransport`` (state is set up in its ``__init__``)."""

    _cfg: MeshtasticConfig
    _clock: Clock
    _jobs: list[_Job]
    _jobs_changed: asyncio.Event
    _acks: dict[int, tuple[_Job, _Part]]
    _recent_routing: OrderedDict[int, tuple[int | None, str]]
    _last_tx: float
    _reply_cooldown: Cooldown

    # --- capacity ------------------------------------------------------------------------------
    def busy_for(self) -> float | None:
        """None when a new reply can be queued; else roughly when there will be room."""
        waiting = [j for j in self._jobs if not j.started]
        if len(waiting) < self._cfg.outbox_limit:
            return None
        packets = sum(len(j.parts) for j in waiting)
        return packets * self._cfg.spacing_seconds + self._cfg.ack_timeout

    # --- ACK bookkeeping (loop thread) ------------------------------------------------------
    def _routing_in(self, packet: Mapping[str, Any], decoded: Mapping[str, Any]) -> None:
        request = decoded.get("requestId")
        if not isinstance(request, int):
            return
        routing = decoded.get("routing") or {}
        reason = routing.get("errorReason", "NONE") if isinstance(routing, Mapping) else "NONE"
        frm = packet.get("from")
        sender = frm if isinstance(frm, int) else None
        waiting = self._acks.get(request)
        if waiting is None:  # the answer overtook the worker's return of the packet id
            self._recent_routing[request] = (sender, str(reason))
            while len(self._recent_routing) > 64:
                self._recent_routing.popitem(last=False)
            return
        self._apply_routing(*waiting, sender, str(reason))

    def _apply_routing(self, job: _Job, part: _Part, frm: int | None, reason: str) -> None:
        if part.state != "flying":
            return
        if reason != "NONE":
            if reason == "MAX_RETRANSMIT":
                job.cost += FIRMWARE_RETRANSMISSIONS
            self._miss(job, part, reason)
        elif frm == job.dest:
            part.state = "ack"
        else:
            part.relayed = True  # implicit ACK: a neighbour rebroadcast it; keep waiting
            return
        if part.pid is not None:
            self._acks.pop(part.pid, None)
        self._jobs_changed.set()

    def _miss(self, job: _Job, part: _Part, reason: str) -> None:
        """A part that was not delivered: re-send later if that can help and is affordable."""
        part.reason = reason
        if reason not in RESENDABLE and reason != NO_ACK:
            part.state = "failed"
            log.info("part %d to %s failed: %s (a re-send cannot fix it)", part.index + 1,
                     job.person, reason)  # fmt: skip
            return
        part.state = "missing" if part.sends <= self._cfg.ack_retries else "failed"
        backoff = self._cfg.ack_backoff * 2 ** max(0, part.sends - 1)
        job.resend_at = max(job.resend_at, self._clock.monotonic() + backoff)

    def _expire_acks(self, now: float) -> float:
        """Parts whose ACK is overdue become missing. Returns the next deadline."""
        wake = math.inf
        for job in self._jobs:
            for part in job.parts:
                if part.state != "flying":
                    continue
                deadline = part.sent_at + self._cfg.ack_timeout
                if now < deadline:
                    wake = min(wake, deadline)
                    continue
                if part.pid is not None:
                    self._acks.pop(part.pid, None)
                if part.relayed:
                    part.state = "relayed"
                else:
                    job.cost += FIRMWARE_RETRANSMISSIONS  # the firmware tried before giving up
                    self._miss(job, part, NO_ACK)
        return wake

    # --- scheduling ------------------------------------------------------------------------------
    async def _outbox_loop(self) -> None:
        while True:
            job, parts = await self._next_burst()
            try:
                sent = await self._send_burst(job, parts)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # loop boundary: a bug in one reply must not stop the outbox
                log.exception("sending a reply failed")
                self._finish(job, Delivery(DeliveryStatus.FAILED, detail=f"internal error: {exc}"))
                continue
            if not sent:
                self._finish(
                    job,
                    Delivery(
                        DeliveryStatus.PENDING,
                        message_ids=tuple(job.ids),
                        detail=f"no radio link for {self._cfg.queue_wait:.0f} s",
                    ),
                )

    async def _next_burst(self) -> tuple[_Job, list[_Part]]:
        while True:
            self._jobs_changed.clear()
            now = self._clock.monotonic()
            wake = self._expire_acks(now)
            for job in list(self._jobs):
                self._maybe_finish(job)
            budget = self._cfg.airtime_budget
            for job in self._jobs:  # re-sends first: they are older than any new reply
                missing = job.missing()
                if not missing or job.waiting():
                    continue
                worst = len(missing) * (1 + FIRMWARE_RETRANSMISSIONS)
                if job.cost + worst > budget:
                    for part in missing:
                        part.state, part.reason = "failed", f"{part.reason}; airtime budget spent"
                    self._maybe_finish(job)
                    continue
                if job.resend_at <= now:
                    return job, missing
                wake = min(wake, job.resend_at)
            for job in self._jobs:
                if job.started:
                    continue
                at = self._reply_cooldown.ready_at(job.person)
                if at <= now:
                    return job, [p for p in job.parts if p.state == "todo"]
                wake = min(wake, at)
            if wake == math.inf:
                await self._jobs_changed.wait()
            else:
                await self._wait(self._jobs_changed, wake - now)

    async def _send_burst(self, job: _Job, parts: list[_Part]) -> bool:
        """Write ``parts`` back to back. False when the link stayed down too long."""
        attempt = max((p.sends for p in parts), default=0)
        if attempt:
            log.info("re-sending %d of %d part(s) to %s (attempt %d)", len(parts),
                     len(job.parts), job.person, attempt + 1)  # fmt: skip
        deadline = job.enqueued_at + self._cfg.queue_wait
        await self._wait_for_quiet_channel()
        for part in parts:
            if job.future.done():  # dropped (send cancelled) while we were writing
                return True
            # A part the radio has taken must be recorded before a shutdown stops us (else the
            # restart sends it again): a cancel waits for this one part to be written and
            # recorded (bounded by the write's own timeout), then takes effect.
            step = asyncio.ensure_future(self._send_part(job, part, deadline))
            try:
                written = await asyncio.shield(step)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await step
                raise
            if not written:
                return False
        job.started = True
        self._reply_cooldown.note(job.person, self._clock.monotonic())
        self._maybe_finish(job)
        return True

    async def _send_part(self, job: _Job, part: _Part, deadline: float) -> bool:
        """Write one part and record it (in memory and in the durable outbox)."""
        pid = await self._transmit(job, part, deadline)
        if pid is None:
            return False
        part.pid, part.sent_at = pid, self._clock.monotonic()
        part.sends += 1
        job.cost += 1
        job.ids.append(str(pid))
        if job.want_ack:
            part.state = "flying"
            self._acks[pid] = (job, part)
            early = self._recent_routing.pop(pid, None)
            if early is not None:
                self._apply_routing(job, part, *early)
        else:
            part.state = "sent"
        if job.reply.progress is not None:
            try:
                await job.reply.progress(part.index, str(pid))
            except Exception:  # the store failing must not stop the radio; logged
                log.exception("could not record part %d to %s", part.index + 1, job.person)
        return True

    def _maybe_finish(self, job: _Job) -> None:
        if job.future.done():
            return
        if any(p.state in ("todo", "flying", "missing") for p in job.parts):
            return
        n = len(job.parts)
        failed = [p for p in job.parts if p.state == "failed"]
        if failed:
            detail = "; ".join(f"part {p.index + 1}/{n}: {p.reason}" for p in failed)
            delivery = Delivery(DeliveryStatus.FAILED, message_ids=tuple(job.ids), detail=detail)
        elif all(p.state == "ack" for p in job.parts):
            delivery = Delivery(DeliveryStatus.DELIVERED, message_ids=tuple(job.ids))
        elif any(p.state == "relayed" for p in job.parts):
            delivery = Delivery(
                DeliveryStatus.SENT,
                message_ids=tuple(job.ids),
                detail="relayed by the mesh; the recipient did not confirm",
            )
        else:
            delivery = Delivery(DeliveryStatus.SENT, message_ids=tuple(job.ids))
        self._finish(job, delivery)

    def _finish(self, job: _Job, delivery: Delivery) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
        for part in job.parts:
            if part.pid is not None:
                self._acks.pop(part.pid, None)
        if not job.future.done():
            job.future.set_result(delivery)
        log.info(
            "reply to %s: %s (%d part(s), %d transmission(s) counted)%s",
            job.person,
            delivery.status.value,
            len(job.parts),
            job.cost,
            f" - {delivery.detail}" if delivery.detail else "",
        )
        self._jobs_changed.set()

    def _drop(self, job: _Job) -> None:
        """The caller stopped waiting (shutdown): forget the job; the outbox row stays."""
        self._finish(job, Delivery(DeliveryStatus.PENDING, detail="cancelled"))

    # --- writing ------------------------------------------------------------------------------
    async def _transmit(self, job: _Job, part: _Part, deadline: float) -> int | None:
        """Put one part on air: wait for the link, the spacing (and, for a broadcast, a link
        known to be up). A failed write takes the link down and the part is retried on the next
        link. None when no link came up before ``deadline``."""
        from meshtastic.protobuf import portnums_pb2

        text = part.text
        reply_id = _reply_id(job.reply) if part.index == 0 else None
        min_generation = 0
        while True:
            if not await self._wait_link(min_generation, deadline):
                return None
            if not job.want_ack and not await self._known_up():
                self._link_down("no answer from the node before a broadcast")
                min_generation = self._generation + 1
                continue
            await self._pace()
            iface = self._iface
            if iface is None or not self._link_ready(min_generation):
                continue
            generation = self._generation

            def write(iface: RadioInterface = iface) -> Any:
                return iface.sendData(
                    text.encode("utf-8"),
                    destinationId=job.dest,
                    portNum=portnums_pb2.PortNum.TEXT_MESSAGE_APP,
                    wantAck=job.want_ack,
                    channelIndex=job.channel,
                    hopLimit=self._cfg.hop_limit,
                    replyId=reply_id,
                )

            try:
                packet = await self._call(write, timeout=self._cfg.call_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed write means a bad link: reconnect, then retry
                self._last_tx = self._clock.monotonic()
                log.warning("sending a part failed (%s: %s)", type(exc).__name__, exc)
                if self._generation == generation:
                    self._link_down(f"send failed: {type(exc).__name__}")
                min_generation = generation + 1
                continue
            self._last_tx = self._clock.monotonic()
            log.debug("sent part %d/%d to %s: %r", part.index + 1, len(job.parts), job.person,
                      text)  # fmt: skip
            return int(packet.id)

    async def _known_up(self) -> bool:
        if self._clock.monotonic() - self._last_rx < KNOWN_UP_SECONDS:
            return True
        return await self._probe()

    async def _pace(self) -> None:
        while True:
            remaining = self._cfg.spacing_seconds - (self._clock.monotonic() - self._last_tx)
            if remaining <= 0:
                return
            await self._clock.sleep(remaining)

    async def _wait_for_quiet_channel(self) -> None:
        util = self._channel_util
        if util is None or util <= self._cfg.busy_threshold:
            return
        log.info("channel busy (%.0f%% > %.0f%%); deferring", util, self._cfg.busy_threshold)
        waited = 0.0
        while waited < self._cfg.busy_max_wait:
            step = min(self._cfg.busy_poll, self._cfg.busy_max_wait - waited)
            await self._clock.sleep(step)
            waited += step
            util = self._channel_util
            if util is None or util <= self._cfg.busy_threshold:
                return
        log.warning("channel still busy after %.0f s; sending anyway", waited)


def _reply_id(reply: Reply) -> int | None:
    mid = reply.inbound.message_id
    try:
        return int(mid) if mid else None
    except ValueError:
        return None
