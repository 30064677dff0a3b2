"""The MeshCore outbox: fair, paced sending of numbered parts, DM ACKs and re-sends.

An object of its own (composed by ``MeshCoreTransport``, never mixed in): it holds the jobs,
the pacer and the ACK table, and reaches the radio only through the ``Companion`` the
transport hands it (``link()``; None while the link is down).

The sending model:
- A job is one reply: its parts (``mesh_text.split_parts``/``render_parts``, each within the
  transport's ``chunk_bytes``), to one DM contact (by key prefix) or one channel slot. One job
  is written at a time, its parts in order, each after the pacer's wait (``mesh_airtime.Pacer``:
  spacing, the bot's hourly duty cycle, the channel's airtime from the radio's counters).
- Which job next: one-part notices first, then the oldest job of the person served least
  recently whose ``cooldown`` has passed (fair: one person's long answers never starve
  another's), then re-sends whose backoff has passed.
- A DM part is delivered when the companion pushes the ACK whose code ``MSG_SENT`` announced;
  the ACK wait (the firmware's suggestion x 1.2, at least ``ack_timeout``) does not hold the
  radio: other jobs are written meanwhile. Parts not ACKed are re-sent (the same timestamp and
  text, the attempt number + 1, so a receiver that already has one drops the copy) after
  ``ack_backoff`` doubling per try, at most ``ack_retries`` times; after ``flood_after`` of
  them the contact's path is reset, so the next try floods. An ACK that matches no part yet is
  kept a while (``EARLY_ACKS``): when a ``MSG_SENT`` was lost on the wire and the same packet is
  written again, the code is the same, and the ACK of the first copy confirms it (the
  recipient does not ACK a copy it already has). A part that never got its ACK
  fails the job, and the person is told in one DM notice (which is itself never re-sent).
- A channel part gets no ACK: the job is SENT once its parts are written.
- Every part's timestamp is stored before it is written (``reply.plan``): a re-send after a
  restart repeats the same packet, which a receiver that has it drops. Every part the
  companion accepted is reported (``reply.progress``) before the next; ``reply.done_parts``
  are skipped.
- A part whose write fails because the companion did not answer stays unsent; the job waits
  for the link to come back (``queue_wait`` at most, then PENDING: the durable outbox keeps it).
- ``stop`` ends every job PENDING. Nothing here raises to ``send``'s caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bot.config_meshcore import MeshCoreConfig
from bot.domain import Delivery, DeliveryStatus, Reply, ReplyKind
from bot.transports.mesh_airtime import Pacer
from bot.transports.mesh_rules import Clock, Cooldown
from bot.transports.mesh_text import utf8_len
from bot.transports.meshcore_link import Companion, CompanionRefused, CompanionTimeout
from bot.transports.meshcore_rules import lora_airtime, packet_bytes

log = logging.getLogger("bot.transport.meshcore")

EARLY_ACKS = 256  # ACK codes kept that matched no part yet (their MSG_SENT was lost)
NOT_FOUND = "ERR_CODE_NOT_FOUND"  # the companion has no contact with that key prefix
ACK_FACTOR = 1.2  # the library's own margin over the firmware's suggested timeout
FAILED_NOTICE = (
    "Part {part} of my answer did not reach you after {tries} tries. Ask again if you missed it."
)


@dataclass
class Part:
    index: int
    text: str
    state: str = "todo"  # todo, waiting (for its ACK), done, failed
    timestamp: int | None = None
    attempt: int = 0
    expected: str | None = None
    deadline: float = 0.0
    readded: bool = False  # the contact was added again once for this part


@dataclass
class Job:
    reply: Reply
    person: str
    prefix: str | None  # DM contact key prefix (12 hex digits); None for a channel
    key: str | None  # the full key when known (path resets need it)
    channel: int | None
    parts: list[Part]
    future: asyncio.Future[Delivery]
    enqueued_at: float
    urgent: bool = False  # a one-part notice: goes first, never re-sent
    tries: int = 0  # re-send rounds so far
    ready_at: float = 0.0  # not before (re-send backoff)
    ids: list[str] = field(default_factory=list)

    @property
    def dm(self) -> bool:
        return self.prefix is not None


class MeshCoreOutbox:
    def __init__(
        self,
        *,
        config: MeshCoreConfig,
        clock: Clock,
        link: Callable[[], Companion | None],
        lost: Callable[[str], None],
        own_name: Callable[[], str | None],
        readd: Callable[[Job], Awaitable[bool]] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._readd = readd
        self._cfg = config
        self._clock = clock
        self._link = link
        self._lost = lost
        self._own_name = own_name
        self._wall = wall
        self.pacer = Pacer(
            spacing=config.spacing_seconds,
            channel_limit=config.busy_threshold,
            duty_cycle=config.duty_cycle,
            poll=config.busy_poll,
        )
        self.jobs: list[Job] = []
        self._changed = asyncio.Event()
        self._acks: dict[str, tuple[Job, Part]] = {}
        self._early: OrderedDict[str, None] = OrderedDict()  # ACK codes nobody waited for
        self._served: dict[str, float] = {}
        self._cooldown = Cooldown(seconds=config.cooldown)
        self._last_ts = 0
        self._last_end = float("-inf")
        self.radio = (11, 250.0, 5)  # sf, bw kHz, cr: the companion's, once connected
        self.airtime_sent = 0.0  # seconds on air of every part written (bench, /metrics)
        self.parts_sent = 0
        self.resent = 0
        self.failed = 0

    # --- jobs in ------------------------------------------------------------------------------
    def add(self, job: Job) -> None:
        self.jobs.append(job)
        self._changed.set()

    def drop(self, job: Job) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
        for code in [c for c, (j, _) in self._acks.items() if j is job]:
            del self._acks[code]

    def finish(self, job: Job, delivery: Delivery) -> None:
        self.drop(job)
        if not job.future.done():
            job.future.set_result(delivery)
        self._changed.set()

    def stop(self) -> None:
        for job in list(self.jobs):
            self.finish(job, Delivery(DeliveryStatus.PENDING, detail="transport stopped"))

    def wake(self) -> None:
        self._changed.set()

    # --- ACKs -----------------------------------------------------------------------------------
    def ack(self, code: str) -> None:
        found = self._acks.pop(code, None)
        if found is None:  # not ours, counted already, or its MSG_SENT was lost: keep it a while
            self._early[code] = None
            while len(self._early) > EARLY_ACKS:
                self._early.popitem(last=False)
            return
        _job, part = found
        if part.state == "failed":
            return
        part.state = "done"  # a late ACK of an earlier attempt counts too
        for other in [c for c, (j, p) in self._acks.items() if p is part]:
            del self._acks[other]  # earlier attempts of the same part
        self._changed.set()

    # --- the loop -------------------------------------------------------------------------------
    def _pick(self, now: float) -> Job | None:
        ready = [
            j
            for j in self.jobs
            if j.ready_at <= now
            and any(p.state == "todo" for p in j.parts)
            and not any(p.state == "waiting" for p in j.parts)
        ]
        if not ready:
            return None
        notices = [j for j in ready if j.urgent]
        if notices:
            return notices[0]
        fresh = [j for j in ready if j.tries == 0 and self._cooldown.ready_at(j.person) <= now]
        if fresh:
            return min(fresh, key=lambda j: (self._served.get(j.person, -1e18), j.enqueued_at))
        resends = [j for j in ready if j.tries > 0]
        return resends[0] if resends else None

    def _next_event(self, now: float) -> float | None:
        """Seconds until something may become ready (a backoff, an ACK deadline, a cooldown)."""
        times = [j.ready_at for j in self.jobs if j.ready_at > now]
        times += [p.deadline for j in self.jobs for p in j.parts if p.state == "waiting"]
        times += [self._cooldown.ready_at(j.person) for j in self.jobs if j.tries == 0]
        times += [j.enqueued_at + self._cfg.queue_wait for j in self.jobs]
        later = [t - now for t in times if t > now]
        return min(later) if later else None

    async def run(self) -> None:
        """Forever: expire, pick, write (the transport owns this task)."""
        while True:
            now = self._clock.monotonic()
            self._expire(now)
            job = self._pick(now) if self._link() is not None else None
            if job is None:
                self._changed.clear()
                wait = self._next_event(now)
                await _first(self._changed.wait(), self._clock.sleep(wait) if wait else None)
                continue
            await self._write(job)

    def _expire(self, now: float) -> None:
        for job in list(self.jobs):
            for part in job.parts:
                if part.state == "waiting" and now >= part.deadline:
                    self._unacked(job, part, now)
            if all(p.state in ("done", "failed") for p in job.parts):
                self._done(job)
            elif now - job.enqueued_at >= self._cfg.queue_wait and not any(
                p.state == "waiting" for p in job.parts
            ):
                self.finish(
                    job, Delivery(DeliveryStatus.PENDING, tuple(job.ids), "no link for too long")
                )

    def _unacked(self, job: Job, part: Part, now: float) -> None:
        if job.urgent or job.tries >= self._cfg.ack_retries:
            part.state = "failed"
            for code in [c for c, (_, p) in self._acks.items() if p is part]:
                del self._acks[code]
            return
        part.state = "todo"
        part.attempt += 1
        job.ready_at = max(job.ready_at, now + self._cfg.ack_backoff * 2**job.tries)

    def _done(self, job: Job) -> None:
        failed = [p for p in job.parts if p.state == "failed"]
        if not failed:
            status = DeliveryStatus.DELIVERED if job.dm else DeliveryStatus.SENT
            self.finish(job, Delivery(status, tuple(job.ids)))
            return
        self.failed += 1
        first = failed[0]
        log.warning(
            "a DM to %s was not confirmed: part %d of %d failed after %d tries",
            job.person, first.index + 1, len(job.parts), job.tries + 1,
        )  # fmt: skip
        self.finish(
            job,
            Delivery(
                DeliveryStatus.FAILED, tuple(job.ids), "the recipient did not confirm every part"
            ),
        )
        if not job.urgent and job.reply.kind is not ReplyKind.NOTICE:
            self._tell_failed(job, first, tries=job.tries + 1)

    def _tell_failed(self, job: Job, part: Part, *, tries: int) -> None:
        text = FAILED_NOTICE.format(part=f"{part.index + 1}/{len(job.parts)}", tries=tries)
        notice = Job(
            reply=Reply(inbound=job.reply.inbound, text=text, kind=ReplyKind.NOTICE),
            person=job.person,
            prefix=job.prefix,
            key=job.key,
            channel=None,
            parts=[Part(0, text)],
            future=asyncio.get_running_loop().create_future(),
            enqueued_at=self._clock.monotonic(),
            urgent=True,
        )
        self.add(notice)

    def _airtime(self, job: Job, text: str) -> float:
        name = self._own_name()
        size = packet_bytes(utf8_len(text), dm=job.dm, name_bytes=utf8_len(name or ""))
        sf, bw, cr = self.radio
        return lora_airtime(size, sf=sf, bw_khz=bw, cr=cr)

    def _timestamp(self) -> int:
        self._last_ts = max(int(self._wall()), self._last_ts + 1)  # unique: same text, new packet
        return self._last_ts

    async def _write(self, job: Job) -> None:
        if job.tries == 0 and all(p.attempt == 0 for p in job.parts):
            self._served[job.person] = self._clock.monotonic()
        resend = any(p.attempt > 0 for p in job.parts if p.state == "todo")
        if resend:
            job.tries += 1
            self.resent += 1
            if job.key is not None and job.tries == self._cfg.flood_after:
                await self._reset_path(job)
        for part in job.parts:
            if part.state != "todo":
                continue
            airtime = self._airtime(job, part.text)
            if not await self._paced(airtime, urgent=job.urgent):
                return
            companion = self._link()
            if companion is None:
                return
            if not await self._write_part(companion, job, part, airtime):
                return
        self._cooldown.note(job.person, self._clock.monotonic())
        self._expire(self._clock.monotonic())

    async def _paced(self, airtime: float, *, urgent: bool) -> bool:
        while True:
            now = self._clock.monotonic()
            verdict = self.pacer.wait(now, airtime, last=self._last_end, urgent=urgent)
            if verdict.wait <= 0:
                return True
            if verdict.reason in ("hold", "duty"):
                log.info("holding replies %.0f s (%s)", verdict.wait, verdict.reason)
            await self._clock.sleep(verdict.wait)
            if self._link() is None:
                return False

    async def _write_part(self, companion: Companion, job: Job, part: Part, airtime: float) -> bool:
        reply = job.reply
        if part.timestamp is None:
            planned = dict(reply.packet_ids).get(part.index)
            part.timestamp = planned if planned is not None else self._timestamp()
            if reply.plan is not None and planned is None:
                part.timestamp = await reply.plan(part.index, part.timestamp)
        now = self._clock.monotonic()
        try:
            if job.prefix is not None:
                sent = await companion.send_dm(
                    job.prefix, part.text, timestamp=part.timestamp, attempt=part.attempt
                )
                platform_id = sent.expected_ack
                part.expected = sent.expected_ack
                part.state = "waiting"
                wait = max(self._cfg.ack_timeout, sent.timeout * ACK_FACTOR)
                part.deadline = self._clock.monotonic() + wait
                self._acks[sent.expected_ack] = (job, part)
                if self._early.pop(sent.expected_ack, False) is None:
                    self.ack(sent.expected_ack)  # the same packet went out before and was ACKed
            else:
                assert job.channel is not None
                await companion.send_channel(job.channel, part.text, timestamp=part.timestamp)
                platform_id = f"{part.timestamp:x}"
                part.state = "done"
        except CompanionTimeout as exc:
            self._lost(str(exc))
            return False
        except CompanionRefused as exc:
            if job.dm and exc.code == NOT_FOUND and self._readd is not None and not part.readded:
                part.readded = True  # the contact went (table full, removed): add it, try again
                if await self._readd(job):
                    return await self._write_part(companion, job, part, airtime)
            log.warning("the companion refused a part for %s: %s", job.person, exc.code)
            for rest in job.parts:  # the rest would be refused too: the job ends now
                if rest.state == "todo":
                    rest.state = "failed"
            self._expire(self._clock.monotonic())
            return False
        self.pacer.wrote(now, airtime)
        self._last_end = self._clock.monotonic()
        self.airtime_sent += airtime
        self.parts_sent += 1
        if part.attempt == 0:
            job.ids.append(platform_id)
            if reply.progress is not None:
                await reply.progress(part.index, platform_id)
        return True

    async def _reset_path(self, job: Job) -> None:
        companion = self._link()
        if companion is None or job.key is None:
            return
        try:
            await companion.reset_path(job.key)
            log.info("reset the path to %s: the next try floods", job.person)
        except CompanionRefused as exc:
            log.info("could not reset the path to %s (%s)", job.person, exc.code)
        except CompanionTimeout as exc:
            self._lost(str(exc))


async def _first(*aws: Awaitable[object] | None) -> None:
    """Return when the first of the awaitables (None ones skipped) finishes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws if a is not None]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
