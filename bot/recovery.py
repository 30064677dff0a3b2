"""Recovery of what a crash, a kill or a stopped gateway left unanswered: the part of the turn
pipeline (composed by ``bot.responder``) that runs at start and on every maintenance tick. It
queues jobs (``bot.turn_jobs``) on the conversations' queue (``bot.turn_queue``); what a late
question or a done command is told lives in ``bot.restarts``.

Invariants:
- Every stored question still ``pending`` is queued again at start, whatever its age, each for
  its own answer, in its person's order (ahead of their later questions not started yet; never
  folded into a later question's answer). One older than its transport's ``delivery.max_age``
  is not answered: the person is told (``Lateness.tell_unanswered``: an outbox row that settles the
  question ``expired``; on Discord it edits the half answer a crash left on screen).
- A running gateway takes over the pending questions whose claim went stale, or that were
  never claimed and are older than ``CLAIM_STALE_SECONDS`` (their gateway died), on every
  maintenance tick (``take_over_stale``); questions queued here are never queued twice
  (``TurnQueue.questions``), and the store's compare-and-set claim keeps two gateways from both
  answering.
- Wall-clock ages count only on a trusted clock (``bot.clock``): on a clock not trusted yet
  (a step just seen, NTP not synchronized yet) a recovered question is answered, never told
  it is too old, and nothing is taken over; dates a clock that ran behind wrote count from
  their corrected date.
- Commands are held in the store before they run (``HeldCommands.hold``) and released once their
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
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from bot.answering import Answerer
from bot.clock import ClockWatch
from bot.command_turns import CommandTurns
from bot.delivery import OutboxSender
from bot.domain import Inbound
from bot.memory.keep import CLAIM_STALE_SECONDS
from bot.memory.port import MemoryStore
from bot.restarts import DONE_AT_RESTART, FORGOT_AT_RESTART, NOT_ANSWERED, HeldCommands
from bot.transports.base import Transport
from bot.turn_jobs import CommandJob, DeliverJob, TurnJob
from bot.turn_queue import TurnQueue

__all__ = ["DONE_AT_RESTART", "FORGOT_AT_RESTART", "NOT_ANSWERED", "Recovery"]

log = logging.getLogger("bot.recovery")


class Recovery:
    """Queues what a restart or a dead gateway left (see the module docstring)."""

    def __init__(
        self,
        *,
        store: MemoryStore,
        transports: Mapping[str, Transport],
        outbox: OutboxSender,
        queue: TurnQueue,
        held: HeldCommands,
        answerer: Answerer,
        command_turns: CommandTurns,
    ) -> None:
        self._store = store
        self._transports = transports
        self._outbox = outbox
        self._queue = queue
        self._held = held
        self._answerer = answerer
        self._command_turns = command_turns

    @property
    def _trust(self) -> ClockWatch:
        return self._outbox.trust  # whether wall-clock ages may be acted on (bot.clock)

    async def redeliver(self) -> int:
        """Queue every undelivered outbox row that is not already on its way (its person's
        worker sends it in order; expired rows are marked so). Returns how many."""
        if not self._queue.accepting:
            return 0
        n = 0
        for inbound, row in await self._outbox.waiting():
            self._queue.put(DeliverJob(inbound, row, self._outbox))
            n += 1
        if n:
            log.info("sending %d undelivered reply(ies) from the outbox", n)
        return n

    async def recover_pending(self) -> int:
        """At start: send what the outbox still holds, then queue every stored-but-unanswered
        message from a crash or shutdown, whatever its age, each for its own answer in its
        person's order (too old to answer: the person is told, ``Lateness``)."""
        await self._outbox.release_stale_claims()
        sent = await self.redeliver()
        commands = [
            held
            for held in await self._store.held_commands(transports=tuple(self._transports))
            if not self._held.held_here(held.id)  # heard live since start: queued already
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
            self._queue.put(
                CommandJob(inbound, self._command_turns, held.id, done=held.done, recovered=True)
            )
        if commands:
            log.info("running %d command(s) received before the last shutdown", len(commands))
        return sent + len(commands) + await self._recover(stale_before=None)

    async def take_over_stale(self) -> int:
        """Queue the pending questions whose gateway died (claim older than
        ``CLAIM_STALE_SECONDS``, or never claimed and stored that long ago) and that this
        process does not hold already: a running gateway answers them (or tells)."""
        if not self._queue.accepting or not self._trust.trusted():  # a stepped clock: no take-over
            return 0
        return await self._recover(stale_before=time.time() - CLAIM_STALE_SECONDS)

    async def _recover(self, *, stale_before: float | None) -> int:
        jobs = await self._store.pending_messages(
            since=0.0, transports=tuple(self._transports), stale_before=stale_before
        )
        n = 0
        for key, msg in jobs:
            if msg.id in self._queue.questions:  # queued or being answered here
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
            self._queue.put(TurnJob(inbound, msg.id, self._answerer, recovered=True))
            n += 1
        if n:
            what = "stored before the last shutdown" if stale_before is None else (
                "left by a gateway that stopped")  # fmt: skip
            log.info("answering %d message(s) %s", n, what)
        return n
