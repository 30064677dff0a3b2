"""Recovery of what a crash, a kill or a stopped gateway left unanswered: the part of the
responder (``bot.responder.Responder`` inherits it) that runs at start and on every
maintenance tick.

Invariants:
- Every stored question still ``pending`` is queued again at start, whatever its age, each for
  its own answer, in its person's order (ahead of their later questions not started yet; never
  folded into a later question's answer). One older than its transport's ``delivery.max_age``
  is not answered: the person is told (``_tell_unanswered``: an outbox row that settles the
  question ``expired``; on Discord it edits the half answer a crash left on screen).
- A running gateway takes over the pending questions whose claim went stale, or that were
  never claimed and are older than ``CLAIM_STALE_SECONDS`` (their gateway died), on every
  maintenance tick (``take_over_stale``); questions queued here are never queued twice
  (``_questions``), and the store's compare-and-set claim keeps two gateways from both
  answering.
- Wall-clock ages count only on a trusted clock (``bot.clock``): on a clock not trusted yet
  (a step just seen, NTP not synchronized yet) a recovered question is answered, never told
  it is too old, and nothing is taken over; dates a clock that ran behind wrote count from
  their corrected date.
- Commands are held in the store before they run (``_hold_command``) and released once their
  reply is queued or sent (or they failed and the person was told); at start this gateway's
  held commands run again, except those this process held itself (heard live, e.g. read
  back by Discord catch-up before recovery ran: queued already). A held command whose effect
  had committed (``done``: the mark is written in the effect's own transaction,
  bot.commands) is not run again: its person is told it was done (``DONE_AT_RESTART``). A
  held ``!forget yes`` whose delete had committed (nothing of the person is left) is
  confirmed instead of run (``FORGOT_AT_RESTART``). A held command keeps whether its sender
  was authenticated (``bot.trust``), so its replay is judged as it would have been live.
- Discord catch-up and this replay agree: catch-up skips every message id held as a command
  (held or released, ``known_platform_ids``), so a command is run by one of them only.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime

from bot.clock import ClockWatch
from bot.delivery import DEFAULT_MAX_AGE, OutboxSender
from bot.domain import Inbound
from bot.errors import StorageError
from bot.memory.keep import CLAIM_STALE_SECONDS
from bot.memory.port import MemoryStore
from bot.memory.records import OutboxEntry
from bot.transports.base import Transport

log = logging.getLogger("bot.responder")

FORGOT_AT_RESTART = (
    "Deleted everything I kept about you (your forget finished as I restarted). I no longer "
    "remember you."
)
DONE_AT_RESTART = "Your {command} was done just before I restarted; nothing was repeated."
NOT_ANSWERED = (
    "Sorry, I was offline when you wrote {ago} ago and did not answer. Ask again if you still "
    "need it."
)


class Recovery:
    """Mixin: the responder's recovery (see the module docstring)."""

    _store: MemoryStore
    _transports: dict[str, Transport]
    _outbox: OutboxSender
    _max_age: dict[str, float]
    _questions: set[int]  # stored questions queued or being answered in this process
    _held_here: set[int]  # commands held by this process (queued live; never replayed)
    _accepting: bool
    _wall: Callable[[], float]  # the wall clock that dates answers (a replay's, in benchmarks)
    _trust: ClockWatch  # whether wall-clock ages may be acted on (bot.clock)

    def _enqueue_recovered(
        self,
        inbound: Inbound,
        *,
        message_id: int | None = None,
        command_id: int | None = None,
        done: bool = False,
    ) -> None:
        raise NotImplementedError

    async def redeliver(self) -> int:
        raise NotImplementedError

    async def recover_pending(self) -> int:
        """At start: send what the outbox still holds, then queue every stored-but-unanswered
        message from a crash or shutdown, whatever its age, each for its own answer in its
        person's order (too old to answer: the person is told, ``_tell_unanswered``)."""
        await self._outbox.release_stale_claims()
        sent = await self.redeliver()
        commands = [
            held
            for held in await self._store.held_commands(transports=tuple(self._transports))
            if held.id not in self._held_here  # heard live since start: queued already
        ]
        for held in commands:  # before the questions: they came first or alongside
            inbound = Inbound(
                transport=held.key.transport,
                sender=held.key.person,
                space=held.key.space,
                text=held.text,
                message_id=held.platform_id,
                sender_name=held.author,
                received_at=datetime.fromtimestamp(held.created_at, tz=UTC),
                authenticated=held.authenticated,
            )
            self._enqueue_recovered(inbound, command_id=held.id, done=held.done)
        if commands:
            log.info("running %d command(s) received before the last shutdown", len(commands))
        return sent + len(commands) + await self._recover(stale_before=None)

    async def take_over_stale(self) -> int:
        """Queue the pending questions whose gateway died (claim older than
        ``CLAIM_STALE_SECONDS``, or never claimed and stored that long ago) and that this
        process does not hold already: a running gateway answers them (or tells)."""
        if not self._accepting or not self._trust.trusted():  # a stepped clock: no take-over
            return 0
        return await self._recover(stale_before=time.time() - CLAIM_STALE_SECONDS)

    async def _recover(self, *, stale_before: float | None) -> int:
        jobs = await self._store.pending_messages(
            since=0.0, transports=tuple(self._transports), stale_before=stale_before
        )
        n = 0
        for key, msg in jobs:
            if msg.id in self._questions:  # queued or being answered here
                continue
            inbound = Inbound(
                transport=key.transport,
                sender=key.person,
                space=key.space,
                text=msg.text,
                message_id=msg.platform_id,
                sender_name=msg.author,
                received_at=datetime.fromtimestamp(msg.created_at, tz=UTC),
            )
            self._enqueue_recovered(inbound, message_id=msg.id)
            n += 1
        if n:
            what = "stored before the last shutdown" if stale_before is None else (
                "left by a gateway that stopped")  # fmt: skip
            log.info("answering %d message(s) %s", n, what)
        return n

    def _too_old(self, inbound: Inbound) -> bool:
        """An answer now would be older than the transport's ``delivery.max_age`` allows (on
        a trusted clock only; a date written behind counts from its corrected date)."""
        if not self._trust.trusted():
            return False
        return self._age(inbound) > self._max_age.get(inbound.transport, DEFAULT_MAX_AGE)

    def _age(self, inbound: Inbound) -> float:
        stamp = inbound.received_at.timestamp()
        return min(self._wall() - stamp, self._trust.age(stamp))

    async def _tell_unanswered(self, inbound: Inbound, message_id: int) -> None:
        """A recovered question too old to answer (the bot was down longer than the transport's
        ``max_age``): the person is told, once. The notice is an outbox row that settles the
        question as ``expired`` in the same transaction; on Discord it replaces (edits) the half
        answer a crash left on screen for it, never posted below it."""
        transport = self._transports[inbound.transport]
        age = self._age(inbound)
        log.warning("message %d in %s is %.0f s old; told the person instead of answering",
                    message_id, inbound.key, age)  # fmt: skip
        entry = OutboxEntry(
            inbound.key,
            "notice",
            transport.fit(NOT_ANSWERED.format(ago=_ago(age))),
            reply_to=inbound.message_id,
            question_id=message_id,
        )
        row = await self._store.queue_claimed(entry, question_status="expired")
        await self._outbox.deliver_now(inbound, row)

    async def _told_at_restart(self, inbound: Inbound, text: str, command_id: int | None) -> None:
        """A held command not run again at restart (its effect had committed): its person is
        told, and it is released in the same write as the notice's outbox row."""
        transport = self._transports[inbound.transport]
        entry = OutboxEntry(inbound.key, "command", transport.fit(text),
                            reply_to=inbound.message_id)  # fmt: skip
        row = await self._store.queue_claimed(entry, release=command_id)
        await self._outbox.deliver_now(inbound, row)

    async def _hold_command(self, inbound: Inbound) -> int | None:
        """Store a command before it runs (``held_commands``): one lost to a kill is run at
        the next start. A store that fails (disk full) does not stop the command."""
        try:
            held = await self._store.hold_command(
                inbound.key,
                inbound.text,
                platform_id=inbound.message_id,
                author=inbound.sender_name,
                authenticated=inbound.authenticated,
            )
            self._held_here.add(held)
            return held
        except (sqlite3.Error, StorageError) as exc:
            log.warning("could not hold a command from %s (%s); running it anyway",
                        inbound.key, exc)  # fmt: skip
            return None

    async def _release_command(self, command_id: int | None) -> None:
        if command_id is None:
            return
        self._held_here.discard(command_id)  # released: never listed as held again
        try:
            await self._store.release_command(command_id)
        except (sqlite3.Error, StorageError) as exc:  # run again at the next start: told so
            log.warning("could not release held command %d: %s", command_id, exc)


def _ago(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    if minutes < 120:
        return f"{minutes} min"
    hours = round(minutes / 60)
    return f"{hours} h" if hours < 48 else f"{round(hours / 24)} days"
