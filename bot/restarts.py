"""What a restart leaves behind, for the turn pipeline (``bot.responder`` composes these):
``HeldCommands`` holds commands in the store until their reply is queued (a kill: run at the
next start) and knows which this process held; ``Lateness`` says whether a recovered question
is too old to answer and tells its person (``bot.recovery`` queues what was left).

Invariants (the rest are ``bot.recovery``'s):
- A recovered question older than its transport's ``delivery.max_age`` is not answered: the
  person is told (``tell_unanswered``: an outbox row that settles the question ``expired``; on
  Discord it edits the half answer a crash left on screen). Wall-clock ages count only on a
  trusted clock (``bot.clock``): on a clock not trusted yet a recovered question is answered,
  never told it is too old; dates a clock that ran behind wrote count from their corrected
  date.
- A held command is released once its reply is queued or sent (or it failed and the person
  was told); a store that fails to hold one does not stop it.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Mapping

from bot.clock import ClockWatch
from bot.delivery import DEFAULT_MAX_AGE, OutboxSender
from bot.domain import Inbound
from bot.errors import StorageError
from bot.memory.port import MemoryStore
from bot.memory.records import OutboxEntry
from bot.transports.base import Transport

log = logging.getLogger("bot.restarts")

FORGOT_AT_RESTART = (
    "Deleted everything I kept about you (your forget finished as I restarted). I no longer "
    "remember you."
)
DONE_AT_RESTART = "Your {command} was done just before I restarted; nothing was repeated."
NOT_ANSWERED = (
    "Sorry, I was offline when you wrote {ago} ago and did not answer. Ask again if you still "
    "need it."
)


class Lateness:
    """Whether a recovered question is too old to answer, and the notices that say so."""

    def __init__(
        self,
        *,
        store: MemoryStore,
        transports: Mapping[str, Transport],
        outbox: OutboxSender,
        max_age: Mapping[str, float] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._transports = transports
        self._outbox = outbox
        self._max_age = dict(max_age or {})
        self._wall = wall  # the wall clock that dates answers (a replay's, in benchmarks)

    @property
    def _trust(self) -> ClockWatch:
        return self._outbox.trust  # whether wall-clock ages may be acted on (bot.clock)

    def too_old(self, inbound: Inbound) -> bool:
        """An answer now would be older than the transport's ``delivery.max_age`` allows (on
        a trusted clock only; a date written behind counts from its corrected date)."""
        if not self._trust.trusted():
            return False
        return self._age(inbound) > self._max_age.get(inbound.transport, DEFAULT_MAX_AGE)

    def _age(self, inbound: Inbound) -> float:
        stamp = inbound.received_at.timestamp()
        return min(self._wall() - stamp, self._trust.age(stamp))

    async def tell_unanswered(self, inbound: Inbound, message_id: int) -> None:
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

    async def told_at_restart(self, inbound: Inbound, text: str, command_id: int | None) -> None:
        """A held command not run again at restart (its effect had committed): its person is
        told, and it is released in the same write as the notice's outbox row."""
        transport = self._transports[inbound.transport]
        entry = OutboxEntry(inbound.key, "command", transport.fit(text),
                            reply_to=inbound.message_id)  # fmt: skip
        row = await self._store.queue_claimed(entry, release=command_id)
        await self._outbox.deliver_now(inbound, row)


class HeldCommands:
    """Commands held in the store until their reply is queued (a kill: run at the next start),
    and which of them this process held (queued live: recovery never replays them)."""

    def __init__(self, *, store: MemoryStore) -> None:
        self._store = store
        self._here: set[int] = set()  # commands this process held (recovery skips them)

    def held_here(self, command_id: int) -> bool:
        return command_id in self._here

    async def hold(self, inbound: Inbound) -> int | None:
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
            self._here.add(held)
            return held
        except (sqlite3.Error, StorageError) as exc:
            log.warning("could not hold a command from %s (%s); running it anyway",
                        inbound.key, exc)  # fmt: skip
            return None

    async def release(self, command_id: int | None) -> None:
        if command_id is None:
            return
        self._here.discard(command_id)  # released: never listed as held again
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
