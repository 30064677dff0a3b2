"""The Meshtastic outbox: fair, paced sending of replies and the ACK bookkeeping.

``MeshtasticTransport`` mixes it in with the link (``meshtastic_link.py``).

The sending model (docs/reliability.md and docs/meshtastic.md explain it for operators):
- The unit on air is a *burst*: consecutive parts of ONE reply, chosen when the radio's next
  slot opens (so a notice that arrives meanwhile goes first), each at least
  ``spacing_seconds`` after the previous packet (measured on the injected clock from the end
  of one write to the start of the next). Two people's parts never interleave inside a burst.
- Waiting for ACKs does not hold the radio. As soon as a reply's burst is written, the next
  burst may start: one-packet notices first (a person waiting to hear why), then re-sends
  whose backoff has passed (oldest reply first), then the next new reply whose person is out
  of ``cooldown``. A reply's re-send is one burst of its missing parts, started only when
  none of its parts is still waiting for an answer.
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
- Senders the bot cannot confirm (``mesh_strangers`` states the rule; ``_standing`` alone
  decides who is confirmed): served after the others (for ``STRANGER_WAIT``), ``stranger_retries``
  re-sends, one shared hourly allowance; a reply it cannot cover ends FAILED, no notice.
- Broadcasts (channel replies) get no ACK, so they are written only on a link *known* to be up:
  a packet from the node within ``KNOWN_UP_SECONDS``, else a probe answered first.
- Every part carries a packet id chosen here and stored with the part (``reply.plan``)
  *before* it is written; every later send of that part (an ACK retry, a re-send after a
  crash) repeats that id, so a receiving radio that already has the packet drops the repeat
  (the firmware ignores a (sender, packet id) it has seen) instead of showing it twice. The
  firmware does not ACK a repeat it dropped, so a part re-sent with an id an earlier run
  planned (it may have been on air already) that gets no ACK ends ``sent`` (unconfirmed),
  without further re-sends.
- Every part the library accepted is reported to the durable outbox (``reply.progress``)
  before the next is written; parts listed in ``reply.done_parts`` (sent by an earlier run)
  are skipped. A reply that could not get a link for ``queue_wait`` seconds ends ``PENDING``
  (the responder's outbox tries again later); so do replies waiting at ``stop``. A stop waits
  only for a part already being written (and its record, at most ``STOP_WRITE_WAIT``), never
  for a link to come back or for the pacer: shutdown is bounded whatever the channel does.
- ``busy()`` tells the responder why a new reply would wait too long (``Busy``): a hold (the
  pacer holds answers: duty cycle spent, or the others fill the channel; the true cause comes
  first) or a full queue (``outbox_limit`` replies not started yet), with an estimate and
  whether a one-packet notice may still go out. ``busy_for`` is its number of seconds.
- Channel courtesy (``mesh_airtime.Pacer``, its docstring states the rule): every write waits
  for the pacer, which reads the radio's device metrics (``channelUtilization``,
  ``airUtilTx``; a report older than ``metrics_max_age`` no longer counts) and the bot's own
  airtime ledger (every packet, notices too): normal spacing, longer spacing while the
  channel is near ``busy_threshold``, and holding answers while the others alone fill it or
  the bot's hourly share reaches the duty cycle. Held jobs stay queued without blocking the
  outbox: one-packet notices (``_Job.urgent``) go first whenever the rules allow them, and a
  job held ``busy_max_wait`` (counted from when the pacer first held it) ends ``PENDING``: the
  durable outbox keeps it (its ``max_age`` applies) and offers it again every round. A hold
  that starts between the parts of one reply holds that burst (at most ``busy_max_wait``).
  A radio without device metrics gets spacing and the own duty cycle only, and the transport
  says so when it connects (and when a radio that reported stops: the report expires).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from bot.config import MeshtasticConfig
from bot.domain import Delivery, DeliveryStatus, Reply
from bot.transports.mesh_airtime import RESOLUTION
from bot.transports.mesh_rules import BROADCAST_NUM, Clock, Cooldown, node_num
from bot.transports.mesh_strangers import Standing, Strangers, known_node, rank, standing
from bot.transports.meshtastic_holds import FIRMWARE_RETRANSMISSIONS, MeshHolds, _Job, _Part
from bot.transports.meshtastic_link import RadioInterface

log = logging.getLogger("bot.transport.meshtastic")

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
# At stop, how long a part already being written may take to be written and recorded; past
# it the stop goes on (the restart writes the part again with its stored packet id).
STOP_WRITE_WAIT = 5.0
CONFIRMED_KEPT = 4096  # ACKed (outbox row, part) pairs remembered for a row sent again
NO_ACK = "no ACK"
LATE_ACKED = frozenset({"missing", "relayed", "failed", "sent"})  # a late ACK still delivers
UNCONFIRMED_REPEAT = frozenset({NO_ACK, "MAX_RETRANSMIT"})


class MeshOutbox(MeshHolds):
    """The outbox half of ``MeshtasticTransport`` (state is set up in its ``__init__``)."""

    _cfg: MeshtasticConfig
    _clock: Clock
    _jobs: list[_Job]
    _jobs_changed: asyncio.Event
    _acks: dict[int, tuple[_Job, _Part]]
    _recent_routing: OrderedDict[int, tuple[int | None, str]]
    _confirmed: OrderedDict[tuple[int, int], None]  # (outbox id, part) ACKed in this run
    _last_tx: float
    _reply_cooldown: Cooldown
    _strangers: Strangers

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
            # Every send of a part carries its one packet id: the destination's ACK for any of
            # them, even one that came after its timeout, says the part arrived.
            if reason == "NONE" and frm == job.dest and part.state in LATE_ACKED:
                log.info("part %d to %s: a late ACK (after %s); delivered", part.index + 1,
                         job.person, part.reason or "its timeout")  # fmt: skip
                self._acked(job, part)
                self._maybe_finish(job)
            return
        if reason != "NONE":
            if reason == "MAX_RETRANSMIT":
                job.cost += FIRMWARE_RETRANSMISSIONS
            self._settle(job, part, "lost" if reason == "MAX_RETRANSMIT" else "relayed")
            self._miss(job, part, reason)
        elif frm == job.dest:
            self._settle(job, part, "ack")
            self._acked(job, part)
        else:
            part.relayed = True  # implicit ACK: a neighbour rebroadcast it; keep waiting
            return
        self._jobs_changed.set()  # (the part stays in ``_acks``: a late ACK still counts)

    def _acked(self, job: _Job, part: _Part) -> None:
        part.state = "ack"
        if job.dest != BROADCAST_NUM:
            self._strangers.confirm(job.dest)  # a radio that exists and hears the bot
        if job.reply.outbox_id is not None:  # a later send of the row skips it
            self._confirmed[(job.reply.outbox_id, part.index)] = None
            while len(self._confirmed) > CONFIRMED_KEPT:
                self._confirmed.popitem(last=False)
        self._jobs_changed.set()

    def _miss(self, job: _Job, part: _Part, reason: str) -> None:
        """A part that was not delivered: re-send later if that can help and is affordable."""
        part.reason = reason
        if part.repeat and reason in UNCONFIRMED_REPEAT:
            # Re-sent with the id an earlier run wrote it with: the recipient's radio drops a
            # packet it already has without ACKing it again, so silence is no news.
            part.state = "sent"
            log.info("part %d to %s: no ACK for a re-send after a restart (same packet id; "
                     "it may have arrived before)", part.index + 1, job.person)  # fmt: skip
            return
        if reason not in RESENDABLE and reason != NO_ACK:
            part.state = "failed"
            log.info("part %d to %s failed: %s (a re-send cannot fix it)", part.index + 1,
                     job.person, reason)  # fmt: skip
            return
        retries = self._strangers.retries(self._standing(job), self._cfg.ack_retries)
        part.state = "missing" if part.sends <= retries else "failed"
        if part.state == "failed" and retries < self._cfg.ack_retries:
            part.reason = (f"{reason}; no re-send to a node the radio never heard a NodeInfo "
                           "or key from (stranger_retries)")  # fmt: skip
        if part.state == "failed" and part.sends > 1 and reason in UNCONFIRMED_REPEAT:
            part.reason = (f"{reason} after {part.sends} sends with one packet id (it may "
                           "have arrived: firmware before 2.6 does not ACK a repeat)")  # fmt: skip
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
                # (the part stays in ``_acks`` until its job ends: a late ACK still counts)
                self._settle(job, part, "relayed" if part.relayed else "lost")
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
                detail = self._held or f"no radio link for {self._cfg.queue_wait:.0f} s"
                self._held = ""
                self._finish(
                    job,
                    Delivery(DeliveryStatus.PENDING, message_ids=tuple(job.ids), detail=detail),
                )

    async def _next_burst(self) -> tuple[_Job, list[_Part]]:
        """The next burst: one-packet notices first (a person waiting to hear why), then
        re-sends (older than any new reply), then new replies in order. While the pacer holds
        answers (duty cycle, busy channel), held jobs stay queued and a notice the rules still
        allow overtakes them; a job held ``busy_max_wait`` ends ``PENDING`` (its outbox row
        waits for the next round)."""
        while True:
            self._jobs_changed.clear()
            now = self._clock.monotonic()
            wake = self._expire_acks(now)
            for job in list(self._jobs):
                self._maybe_finish(job)
            held, recheck = self._hold_state(now, urgent=False)
            wake = min(wake, recheck)
            fresh = sorted((j for j in self._jobs if not j.started), key=self._order)
            notices, wake = self._pick([j for j in fresh if j.urgent], now, held, wake)
            if notices is not None:
                return notices
            resend, wake = self._pick_resend(now, held, wake)
            if resend is not None:
                return resend
            answers, wake = self._pick([j for j in fresh if not j.urgent], now, held, wake)
            if answers is not None:
                return answers
            if wake == math.inf:
                await self._jobs_changed.wait()
            else:
                await self._wait(self._jobs_changed, max(wake - now, 0.001))

    def _pick_resend(
        self, now: float, held: str, wake: float
    ) -> tuple[tuple[_Job, list[_Part]] | None, float]:
        """The first re-send due (oldest reply first), or None and when to look again."""
        budget = self._cfg.airtime_budget
        for job in sorted(self._jobs, key=self._order):
            missing = job.missing()
            if not missing or job.waiting():
                continue
            worst = len(missing) * (1 + FIRMWARE_RETRANSMISSIONS)
            if job.cost + worst > budget:
                for part in missing:
                    part.state, part.reason = "failed", f"{part.reason}; airtime budget spent"
                self._maybe_finish(job)
                continue
            if held:
                wake = min(wake, self._keep_held(job, now, held))
                continue
            if job.resend_at <= now:
                if (slot := self._slot(job, missing[0], now)) > 0:
                    wake = min(wake, now + slot)
                    continue
                if not self._affordable(job, missing, now):
                    continue
                return (job, missing), wake
            wake = min(wake, job.resend_at)
        return None, wake

    def _pick(
        self, jobs: list[_Job], now: float, held: str, wake: float
    ) -> tuple[tuple[_Job, list[_Part]] | None, float]:
        """The first of ``jobs`` (not started) that may go now, or None and when to look
        again."""
        for job in jobs:
            if job.future.done():
                continue
            reason = held
            if job.urgent and held:
                reason, urgent_recheck = self._hold_state(now, urgent=True)
                wake = min(wake, urgent_recheck)
            if reason:
                wake = min(wake, self._keep_held(job, now, reason))
                continue
            at = self._reply_cooldown.ready_at(job.person)
            todo = [p for p in job.parts if p.state == "todo"]
            if at <= now and todo and (slot := self._slot(job, todo[0], now)) > 0:
                wake = min(wake, now + slot)  # chosen when its slot opens: a notice
                continue  # arriving meanwhile goes first
            if at <= now:
                if not self._affordable(job, todo, now):
                    continue
                return (job, todo), wake
            wake = min(wake, at)
        return None, wake

    # --- senders the bot cannot confirm (mesh_strangers) ----------------------------------------
    def _standing(self, job: _Job) -> Standing:
        """How far the bot trusts the sender ``job`` answers: the ONE place that decides it.
        ``authenticated``: the question arrived PKI-encrypted with the pinned key (a re-sent
        durable row carries no such flag and falls back to the node DB). Relayed bridge text
        is no mesh sender's."""
        if job.relay:
            return Standing.CONFIRMED
        num = node_num(job.person)
        known = known_node(getattr(self._iface, "nodesByNum", None), num)
        return standing(
            authenticated=job.reply.inbound.authenticated,
            acked=self._strangers.acked(num),
            known=known,
        )

    def _order(self, job: _Job) -> int:
        return rank(self._standing(job), self._clock.monotonic() - job.enqueued_at)

    def _affordable(self, job: _Job, parts: list[_Part], now: float) -> bool:
        """Whether the allowance for unconfirmed senders covers writing ``parts`` at their
        worst. A reply it cannot cover ends FAILED, with no notice (one would spend the
        airtime a flood of invented senders is after); the operator is told once."""
        if self._standing(job) is Standing.CONFIRMED or self._strangers.admit(
            now, sum(self._worst(job, p) for p in parts)
        ):
            return True
        for part in parts:
            part.state = "failed"
            part.reason = "not sent: the hour's airtime for unconfirmed senders is spent"
        self._maybe_finish(job)
        return False

    def _settle(self, job: _Job, part: _Part, outcome: str) -> None:
        """The write of ``part`` ended: ``"ack"`` from its destination (the charge is
        forgiven), ``"relayed"`` or NAKed at once (its one write stays), ``"lost"`` (the
        firmware retransmitted it unanswered)."""
        if part.charge and outcome == "ack":
            self._strangers.allowance.forgive(part.charge)
        elif part.charge and outcome == "lost":
            cost = self._airtime(part) * FIRMWARE_RETRANSMISSIONS
            self._strangers.allowance.add(part.charge, cost)
        part.charge = 0

    def _slot(self, job: _Job, part: _Part, now: float) -> float:
        """Seconds until spacing (or the channel rule's slower pace) lets ``part`` go; holds
        are the caller's. A burst is chosen only when its slot opens, so a notice that arrives
        while the radio waits for it goes first."""
        verdict = self._pacer.wait(now, self._airtime(part), last=self._last_tx, urgent=job.urgent)
        if verdict.reason not in ("", "slow") or verdict.wait < RESOLUTION:
            return 0.0  # (a crumb of a wait: chosen now, ``_pace`` waits it out exactly)
        return verdict.wait

    async def _send_burst(self, job: _Job, parts: list[_Part]) -> bool:
        """Write ``parts`` back to back. False when the link stayed down too long."""
        attempt = max((p.sends for p in parts), default=0)
        if attempt:
            log.info("re-sending %d of %d part(s) to %s (attempt %d)", len(parts),
                     len(job.parts), job.person, attempt + 1)  # fmt: skip
        deadline = job.enqueued_at + self._cfg.queue_wait
        for part in parts:
            if job.future.done():  # dropped (send cancelled) while we were writing
                return True
            # A part the radio has taken must be recorded before a shutdown stops us (else the
            # restart writes it again: the receiver drops that repeat by its packet id, but it
            # costs airtime). A cancel that finds the part being written waits for the write
            # and its record, at most STOP_WRITE_WAIT; one that finds it waiting (for a link,
            # for the pacer: up to queue_wait / busy_max_wait) takes effect at once, so a stop
            # is never held by a reply that cannot go out.
            step = asyncio.ensure_future(self._send_part(job, part, deadline))
            try:
                written = await asyncio.shield(step)
            except asyncio.CancelledError:
                if part.writing:
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await asyncio.wait_for(asyncio.shield(step), STOP_WRITE_WAIT)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(Exception, asyncio.CancelledError):
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
        if part.packet_id is None:
            part.packet_id = await self._plan_packet_id(job, part)
        try:
            return await self._send_and_record(job, part, deadline)
        finally:
            part.writing = False

    async def _send_and_record(self, job: _Job, part: _Part, deadline: float) -> bool:
        pid = await self._transmit(job, part, deadline)
        if pid is None:
            return False
        part.pid, part.sent_at = pid, self._clock.monotonic()
        part.sends += 1
        job.cost += 1
        if self._standing(job) is not Standing.CONFIRMED:
            part.charge = self._strangers.allowance.charge(part.sent_at, self._airtime(part))
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

    async def _plan_packet_id(self, job: _Job, part: _Part) -> int:
        """The part's nonzero 32-bit packet id, stored with the part before it is written (the
        id stored first wins). A part of an outbox row gets an id derived from the row, the
        part and its text (``derived_packet_id``): when the store fails (disk full) the part
        still goes out, and a later run plans the same id again, so the receiver drops the
        repeat instead of showing the part twice. Other replies get a random id."""
        row = job.reply.outbox_id
        if row is not None:
            chosen = derived_packet_id(row, part.index, job.person, part.text)
        else:  # never a seeded rng: ids must not repeat
            chosen = secrets.randbelow((1 << 32) - 1) + 1
        if job.reply.plan is None:
            return chosen
        try:
            stored = await job.reply.plan(part.index, chosen)
        except Exception:  # the store failing must not stop the radio; logged
            log.exception("could not store the packet id of part %d to %s", part.index + 1,
                          job.person)  # fmt: skip
            return chosen
        if stored and stored != chosen:
            part.repeat = True  # another run planned (and perhaps wrote) this part already
        return stored or chosen

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
        text = part.text
        reply_id = _reply_id(job.reply) if part.index == 0 else None
        packet_id = part.packet_id or 0
        min_generation = 0
        while True:
            if not await self._wait_link(min_generation, deadline):
                return None
            if not job.want_ack and not await self._known_up():
                self._link_down("no answer from the node before a broadcast")
                min_generation = self._generation + 1
                continue
            if not await self._pace(job, part):
                return None  # held past busy_max_wait: the durable outbox keeps the reply
            iface = self._iface
            if iface is None or not self._link_ready(min_generation):
                continue
            generation = self._generation

            def write(iface: RadioInterface = iface) -> Any:
                # Imported here, on the worker thread the library runs on: importing protobuf
                # modules from two threads at once can fail ("Couldn't build proto file into
                # descriptor pool"), seen when the loop thread imported mesh_pb2.
                from meshtastic.protobuf import mesh_pb2, portnums_pb2

                # As the library's sendData builds it, with our planned id (kept when nonzero).
                packet = mesh_pb2.MeshPacket()
                packet.channel = job.channel
                packet.decoded.payload = text.encode("utf-8")
                packet.decoded.portnum = portnums_pb2.PortNum.TEXT_MESSAGE_APP
                packet.id = packet_id
                if reply_id is not None:
                    packet.decoded.reply_id = reply_id
                if job.tapback:
                    packet.decoded.emoji = 1
                packet.priority = mesh_pb2.MeshPacket.Priority.RELIABLE
                return iface._sendPacket(
                    packet,
                    destinationId=job.dest,
                    wantAck=job.want_ack,
                    hopLimit=self._cfg.hop_limit,
                )

            part.writing = True
            try:
                packet = await self._call(write, timeout=self._cfg.call_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed write means a bad link: reconnect, then retry
                part.writing = False
                self._last_tx = self._clock.monotonic()
                log.warning("sending a part failed (%s: %s)", type(exc).__name__, exc)
                if self._generation == generation:
                    self._link_down(f"send failed: {type(exc).__name__}")
                min_generation = generation + 1
                continue
            self._last_tx = self._clock.monotonic()
            self._pacer.wrote(self._last_tx, self._airtime(part))
            log.debug("sent part %d/%d to %s: %r", part.index + 1, len(job.parts), job.person,
                      text)  # fmt: skip
            return int(packet.id)

    async def _known_up(self) -> bool:
        if self._clock.monotonic() - self._last_rx < KNOWN_UP_SECONDS:
            return True
        return await self._probe()


def _reply_id(reply: Reply) -> int | None:
    mid = reply.inbound.message_id
    try:
        return int(mid) if mid else None
    except ValueError:
        return None


def derived_packet_id(outbox_id: int, part: int, person: str, text: str) -> int:
    """A nonzero 32-bit packet id that is the same whenever this part of this outbox row is
    planned (the text and person keep a reused row id from repeating an old id)."""
    digest = hashlib.blake2b(f"{outbox_id}:{part}:{person}:{text}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "big") or 1
