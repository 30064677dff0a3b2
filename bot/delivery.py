"""Outbox delivery: sending the rows of the durable outbox, and recovering the ones left behind.

The responder (``bot.responder``) runs the turns and composes one ``OutboxSender``; the sender
owns how a stored reply reaches a transport and how its row is finished.

Invariants:
- The durable outbox: an outbox row holds exactly what the transport sends (``transport.fit``;
  on the mesh the rest is kept for ``!more``). The transport reports every part it put out
  (``record_part``; mesh packet ids are planned before the write, ``plan_part``) and the row is
  finished with the delivery result. Rows the transport could not send (``PENDING``: no link)
  and rows left by a crash are sent again (``waiting``, queued by the responder's ``redeliver``
  at start and on every maintenance tick), only their missing parts; rows older than the
  transport's ``delivery.max_age`` are marked expired instead of sent.
- At most once by construction: a row is sent only under its claim in the store (a
  compare-and-set, ``bot.memory.outbox_claims``). A turn creates its row already claimed
  (``queue_delivery(claim=True)``) and sends it with ``deliver_now``, so no round sees it while
  it is sent or streamed; a round claims each row it queued when its turn comes (``deliver``)
  and sends the row *as the claim returned it* (its recorded parts are current), so a row
  delivered meanwhile is skipped, never re-sent. A reply that waits for its link gives its claim
  back; claims a dead process left are released at start (``release_stale_claims``).
  ``in_flight`` only keeps a row from being queued twice in this process.
- Streaming (transports with ``Streams``): once the outbox row exists, the stream finishes it
  (exactly the row's text, parts recorded through ``progress``) instead of a second send. Every
  message a stream posts is recorded by question as it is posted (``record_shown``); after a
  restart the question's next stream, or the ``send`` of its row (``Reply.shown``), edits those
  messages into the answer: a half answer on screen is finished, never followed by a second.
- A store error while a claim is taken, given back or its row finished (the store briefly
  down) never ends the row: the row stays ``pending`` and its claim is given back by a later
  round (``waiting`` retries it first), so the row is sent again, still only under a claim.
- On a paced transport (``Congested``: the mesh) a person's replies go out in order even across
  holds (notices excepted: they go first, never behind a held answer): a row given back for a
  later round (``PENDING``) keeps that person's later rows waiting behind it (they are given
  back too, and each round queues them oldest first); the set is refreshed from the store
  every round, so a row finished elsewhere never blocks.
- ``delivering`` names the conversations whose worker is waiting on a transport right now, so a
  shutdown can cut them at once (the row stays pending and goes out after the restart).
- A transport that raises from ``send`` (a bug: trouble is reported in ``Delivery``) yields a
  ``FAILED`` delivery; it never breaks the person's queue.
- Notices are sent straight away, fitted to the transport. A notice the transport could not
  send (``PENDING``: held by the airtime rules, no link) is stored as an outbox row and sent
  like an answer by a later round (``keep=False``: a notice whose question's answer is in the
  outbox already, which tells the person anyway). A notice the store cannot take either (disk
  full) is kept in memory (bounded) and stored by a later round.
- A row's age follows the injected monotonic ``clock`` (the virtual clock of the mesh soak),
  never a wall-clock step: a row this process wrote is aged from when it wrote it; a row from
  before (an earlier run, a gateway that died) starts at its stored date's age
  (``created_at``, corrected by ``bot.clock`` for a clock that ran behind) when this process
  first sees it on a trusted clock, at 0 on a clock not trusted yet.
- A row that expires (older than ``max_age``) tells its person once: one "could not send in
  time, please ask again" notice per person while an earlier one is still waiting; expiry
  notices themselves (a notice with no question and no message it replies to) never spawn
  another.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping

from bot.clock import ClockWatch, Sync
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply, ReplyKind
from bot.errors import StorageError
from bot.memory.port_work import Outbox
from bot.memory.records import OutboxEntry, OutboxRow
from bot.transports.base import AnswerStream, Busy, Congested, ExplainsBusy, Streams, Transport

log = logging.getLogger("bot.responder")

DEFAULT_MAX_AGE = 3600.0
EXPIRED = "Sorry, I could not send my reply to your earlier message in time. Please ask again."
UNSTORED_KEPT = 256  # notices the store could not take, kept in memory for a later round
SEEN_KEPT = 65_536  # rows whose first sighting on the monotonic clock is remembered
HELD = {  # a hold: the answer is stored and goes out when there is room (short: airtime)
    "duty": "Airtime limit reached. Your answer is saved; it comes in about {minutes} min.",
    "channel": "Channel busy. Your answer is saved; it comes in about {minutes} min.",
}


def busy_now(transport: Transport) -> Busy | None:
    """Why ``transport`` cannot take a reply now (None: it can)."""
    if isinstance(transport, ExplainsBusy):
        return transport.busy()
    if isinstance(transport, Congested) and (wait := transport.busy_for()) is not None:
        return Busy("queue", wait)
    return None


# What a store raises when it is briefly unusable (locked, disk full, server unreachable).
STORE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, StorageError)


class OutboxSender:
    """Sends outbox rows through the attached transports and records each outcome."""

    def __init__(
        self,
        *,
        store: Outbox,
        transports: Mapping[str, Transport],
        max_age: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        trust: ClockWatch | None = None,
        first_part: Callable[[float], None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._trust = trust or ClockWatch(sync=_Unknown())  # whether stored dates count
        self._seen: dict[int, float] = {}  # row id -> its birth on ``clock`` (ages)
        self._transports = transports  # the responder's table: attached transports appear here
        self._max_age = dict(max_age or {})
        self.in_flight: set[int] = set()  # outbox rows queued or being sent
        self._delivering: Counter[tuple[str, str, str]] = Counter()  # sends on a transport
        # Told the seconds from a message to its answer's first part accepted (operator's view).
        self._first_part = first_part
        self._unreleased: set[int] = set()  # own claims a store error kept us from giving back
        self._unstored: deque[OutboxEntry] = deque(maxlen=UNSTORED_KEPT)  # notices to store
        self._expiry_told: dict[tuple[str, str, str], int] = {}  # person -> expiry notice row
        # Rows of a person on a paced transport given back for a later round (refreshed from
        # the store every round): a later reply of that person waits behind them.
        self._behind: dict[tuple[str, str, str], set[int]] = {}

    @property
    def store(self) -> Outbox:
        return self._store

    @property
    def trust(self) -> ClockWatch:
        return self._trust

    async def open_stream(self, inbound: Inbound, question_id: int) -> AnswerStream | None:
        """A stream for the answer to ``question_id`` (None when the transport does not
        stream), told which messages an interrupted earlier stream left on screen and
        recording each message it posts."""
        transport = self._transports[inbound.transport]
        if not isinstance(transport, Streams):
            return None

        async def record(part: int, platform_id: str | None) -> None:
            try:
                await self._store.record_shown(question_id, part, platform_id)
            except STORE_ERRORS as exc:  # costs a second message after a crash, not the answer
                log.warning("could not record a streamed message of %s: %s", inbound.key, exc)

        shown = await self._store.shown_parts(question_id)
        return transport.stream(inbound, shown=shown, record=record)

    async def deliver_now(
        self,
        inbound: Inbound,
        row: OutboxRow,
        *,
        note: str | None = None,
        stream: AnswerStream | None = None,
    ) -> Delivery:
        """Send a row this process created claimed (``queue_delivery(claim=True)``)."""
        self.in_flight.add(row.id)
        self.written(row.id)  # written by this process just now
        try:
            return await self.deliver(inbound, row, note=note, stream=stream, claimed=True)
        finally:
            self.in_flight.discard(row.id)

    async def deliver(
        self,
        inbound: Inbound,
        row: OutboxRow,
        *,
        note: str | None = None,
        stream: AnswerStream | None = None,
        claimed: bool = False,
    ) -> Delivery:
        """Send one outbox row (its missing parts) and record the outcome. A streamed answer
        (already on screen) is finished by its stream instead of being sent again. Unless
        ``claimed`` (this process created the row claimed), the row is claimed first and sent
        as the claim returned it; a row claimed or finished meanwhile is not sent."""
        if not claimed:
            try:
                fresh = await self._store.claim_delivery(row.id)
            except STORE_ERRORS as exc:  # the claim may have been taken: give it back later
                self._keep_for_later(row.id, exc)
                return Delivery(DeliveryStatus.PENDING, detail="store unavailable")
            if fresh is None:
                log.debug("outbox row %d is claimed or finished already; not sent again", row.id)
                return Delivery(DeliveryStatus.PENDING, detail="claimed or finished elsewhere")
            row = fresh
        age = self._age(row)
        max_age = self._max_age.get(row.entry.key.transport, DEFAULT_MAX_AGE)
        if age > max_age:
            self._seen.pop(row.id, None)
            log.warning(
                "outbox row %d for %s expired (%.0f s old, max_age %.0f s)",
                row.id,
                row.entry.key,
                age,
                max_age,
            )
            await self._store.finish_delivery(row.id, "expired", detail=f"{age:.0f} s old")
            await self._tell_expired(row)
            return Delivery(DeliveryStatus.FAILED, detail="expired")

        fresh_answer = row.entry.kind == "answer" and not row.parts

        async def progress(part: int, platform_id: str) -> None:
            await self._store.record_part(row.id, part, platform_id)
            if part == 0 and fresh_answer and self._first_part is not None:
                self._first_part(max(0.0, time.time() - inbound.received_at.timestamp()))

        async def plan(part: int, packet_id: int) -> int:
            return await self._store.plan_part(row.id, part, packet_id)

        kind = {"answer": ReplyKind.ANSWER, "notice": ReplyKind.NOTICE}.get(
            row.entry.kind, ReplyKind.COMMAND
        )
        qkey = (row.entry.key.transport, row.entry.key.person, row.entry.key.space)
        behind = self._behind.get(qkey, set())
        behind.discard(row.id)
        if stream is None and row.entry.kind != "notice" and any(i < row.id for i in behind):
            # an earlier reply of this person waits for a later round: in order, this one after
            log.info("outbox row %d for %s goes after the person's earlier reply (row %d)",
                     row.id, row.entry.key, min(behind))  # fmt: skip
            await self._give_back(row, Delivery(DeliveryStatus.PENDING, detail="in order"))
            return Delivery(DeliveryStatus.PENDING, detail="an earlier reply goes first")
        self._delivering[qkey] += 1
        try:
            reply = Reply(
                inbound=inbound,
                text=row.entry.text,
                kind=kind,
                note=note,
                outbox_id=row.id,
                done_parts=frozenset(i for i, _ in row.parts),
                progress=progress,
                packet_ids=row.packet_ids,
                plan=plan,
                shown=row.shown,
            )
            delivery = await (stream.finish(reply) if stream is not None else self.send(reply))
        finally:
            self._delivering[qkey] -= 1
            if self._delivering[qkey] <= 0:
                del self._delivering[qkey]
        await self._give_back(row, delivery)
        return delivery

    def _age(self, row: OutboxRow) -> float:
        """Seconds since ``row`` was written, on the monotonic clock (module docstring)."""
        born = self._seen.get(row.id)
        if born is None:
            stored = self._trust.age(row.created_at) if self._trust.trusted() else 0.0
            born = self.written(row.id, ago=stored)
        return self._clock() - born

    def written(self, row_id: int, *, ago: float = 0.0) -> float:
        """Remember when ``row_id`` was written on the monotonic clock (``ago`` seconds ago)."""
        born = self._seen.setdefault(row_id, self._clock() - ago)
        while len(self._seen) > SEEN_KEPT:
            self._seen.pop(next(iter(self._seen)))
        return born

    @property
    def delivering(self) -> set[tuple[str, str, str]]:
        """The conversations with a send waiting on a transport now (a person's turn worker,
        or their notice lane beside it)."""
        return set(self._delivering)

    async def _give_back(self, row: OutboxRow, delivery: Delivery) -> None:
        """Record the outcome: a ``PENDING`` row is released for a later round (and, on a paced
        transport, later replies of its person wait behind it); others are finished."""
        key = row.entry.key
        try:
            if delivery.status is DeliveryStatus.PENDING:
                log.info("outbox row %d for %s waits for a later round (%s)", row.id, key,
                         delivery.detail or "no link")  # fmt: skip
                await self._store.release_delivery(row.id)  # the next round may claim it again
                if isinstance(self._transports.get(key.transport), Congested):
                    self._behind.setdefault((key.transport, key.person, key.space), set()).add(
                        row.id
                    )
            else:
                await self._store.finish_delivery(
                    row.id, delivery.status.value, detail=delivery.detail
                )
                self._seen.pop(row.id, None)
        except STORE_ERRORS as exc:
            # The row stays pending under our claim (nobody else sends it); a later round gives
            # the claim back and sends what is still missing (recorded parts never again).
            self._keep_for_later(row.id, exc)

    def _keep_for_later(self, row_id: int, exc: BaseException) -> None:
        log.warning(
            "store unavailable for outbox row %d (%s); it stays pending for a later round",
            row_id,
            exc,
        )
        self._unreleased.add(row_id)

    async def _release_kept(self) -> None:
        """Give back the claims a store error kept (in ``deliver``); stops at the first error
        (the store is still down: the next round tries again)."""
        for row_id in sorted(self._unreleased):
            await self._store.release_delivery(row_id)
            self._unreleased.discard(row_id)

    async def send(self, reply: Reply) -> Delivery:
        transport = self._transports[reply.inbound.transport]
        try:
            return await transport.send(reply)
        except Exception as exc:  # transports report trouble in Delivery; this is a bug guard
            log.exception("transport %s raised from send", transport.name)
            return Delivery(DeliveryStatus.FAILED, detail=str(exc))

    async def notice(self, inbound: Inbound, text: str, *, keep: bool = True) -> Delivery:
        """Send a notice now; one the transport could not send is stored for a later round
        (unless ``keep`` is False: the caller has another way to reach the person)."""
        transport = self._transports[inbound.transport]
        fitted = transport.fit(text)
        delivery = await self.send(Reply(inbound=inbound, text=fitted, kind=ReplyKind.NOTICE))
        if delivery.status is DeliveryStatus.PENDING and keep:
            entry = OutboxEntry(inbound.key, "notice", fitted, reply_to=inbound.message_id)
            await self._store_notice(entry, why=f"not sent now: {delivery.detail or 'pending'}")
        return delivery

    async def notice_later(self, inbound: Inbound, text: str) -> OutboxRow | None:
        """A notice stored as an outbox row (unclaimed), for the caller to queue behind the
        person's jobs (it must not wait for the transport: a radio's receive loop). None when
        the store refused it (kept in memory for a later round)."""
        transport = self._transports[inbound.transport]
        entry = OutboxEntry(inbound.key, "notice", transport.fit(text), reply_to=inbound.message_id)
        row_id = await self._store_notice(entry, why="queued behind the person's jobs")
        if row_id is None:
            return None
        try:
            return await self._store.outbox_row(row_id)
        except STORE_ERRORS:  # stored: the next round sends it
            return None

    async def busy_notice(self, inbound: Inbound, text: str, *, question_id: int | None) -> None:
        """A full queue: "busy, try again" as an outbox row (the question ``limited`` in the
        same transaction), so a notice that must wait is sent later, never dropped."""
        transport = self._transports[inbound.transport]
        entry = OutboxEntry(
            inbound.key,
            "notice",
            transport.fit(text),
            reply_to=inbound.message_id,
            question_id=question_id,
        )
        try:
            row = await self._store.queue_claimed(
                entry, question_status="limited" if question_id is not None else None
            )
        except STORE_ERRORS as exc:  # disk full: tell now (kept in memory if it must wait)
            log.error("could not store the busy notice for %s: %s", inbound.key, exc)
            await self.notice(inbound, text)
            return
        await self.deliver_now(inbound, row)

    async def tell_held(self, inbound: Inbound, busy: Busy, *, wait: bool = False) -> None:
        """A hold: tell the person why and that the answer is saved, if a notice can still go
        out (``wait``: also when it cannot now; the transport sends it first as soon as the
        radio may transmit, within its ``busy_max_wait``); the stored answer is what reaches
        them either way (so this one is not stored)."""
        why = "the duty cycle is spent" if busy.cause == "duty" else "the channel is busy"
        if not busy.notice_now:
            log.info("%s (about %.0f s); nothing may go on air now: %s is told as soon as the "
                     "radio may transmit%s", why, busy.seconds, inbound.key,
                     "" if wait else ", by the answer")  # fmt: skip
            if not wait:
                return
        minutes = max(1, math.ceil(busy.seconds / 60))
        text = HELD.get(busy.cause, HELD["channel"]).format(minutes=minutes)
        delivery = await self.notice(inbound, text, keep=False)
        log.info("%s (about %.0f s); told %s the answer waits in the outbox: %s", why,
                 busy.seconds, inbound.key, delivery.status.value)  # fmt: skip

    async def _store_notice(self, entry: OutboxEntry, *, why: str) -> int | None:
        """Store a notice as an outbox row (a later round sends it); kept in memory when the
        store refuses (disk full) and stored by a later round."""
        try:
            row_id = await self._store.queue_delivery(entry)
        except STORE_ERRORS as exc:
            self._unstored.append(entry)
            log.error("could not store a notice for %s (%s; %s); kept in memory for a later "
                      "round", entry.key, exc, why)  # fmt: skip
            return None
        log.info("notice for %s is outbox row %d (%s)", entry.key, row_id, why)  # fmt: skip
        self.written(row_id)
        return row_id

    async def _tell_expired(self, row: OutboxRow) -> None:
        """Tell the person of an expired row, once (see the module docstring)."""
        entry = row.entry
        if entry.kind == "notice" and entry.question_id is None and entry.reply_to is None:
            return  # an expiry notice (or one like it): telling about it would loop
        who = (entry.key.transport, entry.key.person, entry.key.space)
        told = self._expiry_told.get(who)
        if told is not None:
            try:
                earlier = await self._store.outbox_row(told)
            except STORE_ERRORS:
                earlier = None
            if earlier is not None and earlier.state == "pending":
                return  # the earlier expiry notice has not gone out yet: it covers this one
        transport = self._transports.get(entry.key.transport)
        if transport is None:
            return
        notice = OutboxEntry(entry.key, "notice", transport.fit(EXPIRED))
        row_id = await self._store_notice(notice, why=f"outbox row {row.id} expired")
        if row_id is not None:
            self._expiry_told[who] = row_id
            while len(self._expiry_told) > UNSTORED_KEPT:
                self._expiry_told.pop(next(iter(self._expiry_told)))

    async def _store_unstored(self) -> None:
        """Store the notices a full disk kept in memory (stops at the first error)."""
        while self._unstored:
            entry = self._unstored[0]
            await self._store.queue_delivery(entry)
            self._unstored.popleft()
            log.info("stored a notice for %s kept in memory since the store refused it",
                     entry.key)  # fmt: skip

    async def fail(self, row_id: int) -> None:
        """A delivery that crashed: end the row, never loop on it."""
        try:
            await self._store.finish_delivery(row_id, "failed", detail="internal error")
        except Exception:  # loop boundary: the store may be what failed; retried later
            log.exception("could not mark outbox row %d failed", row_id)

    async def release_stale_claims(self) -> int:
        """At start: give back the claims a process that died left on its rows."""
        released = await self._store.release_stale_claims()
        if released:
            log.info("released %d outbox claim(s) left by a process that died", released)
        return released

    async def waiting(self) -> list[tuple[Inbound, OutboxRow]]:
        """Every undelivered row not already on its way in this process, with the inbound its
        person's worker sends it for (expired rows are marked so when their turn comes)."""
        try:
            await self._release_kept()
            await self._store_unstored()
        except STORE_ERRORS as exc:
            log.warning("store still unavailable; outbox claims and notices kept for the next "
                        "round: %s", exc)  # fmt: skip
        rows = await self._store.undelivered(transports=tuple(self._transports))
        self._behind = {}
        for row in rows:  # what waits now, in this store (other gateways' claims excluded)
            key = row.entry.key
            if isinstance(self._transports.get(key.transport), Congested):
                self._behind.setdefault((key.transport, key.person, key.space), set()).add(row.id)
        out: list[tuple[Inbound, OutboxRow]] = []
        for row in rows:
            if row.id in self.in_flight:
                continue
            key = row.entry.key
            inbound = Inbound(
                transport=key.transport,
                sender=key.person,
                space=key.space,
                text="",
                message_id=row.entry.reply_to,
            )
            out.append((inbound, row))
        return out


class _Unknown:
    """A system that does not say whether its clock is synchronized (only steps count)."""

    def read(self) -> Sync:
        return Sync()
