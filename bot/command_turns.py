"""Running a command as a conversation's job: the reply through the outbox, the held command
released with it, incognito ended where the command ends it.

Invariants (with those of ``bot.responder``):
- A command runs in its person's queue (``bot.turn_queue``), in arrival order with their
  messages; ``events`` counts every start and end, ``running`` how many run now: a turn
  whose conversation was read at intake reads it again when a command started, ended or ran
  since (commands are what change conversation rows), and the LLM gate counts a person at
  work by ``events``.
- A held command whose effect committed before a kill (``done``) is told, never applied twice
  (``DONE_AT_RESTART``); a recovered ``!forget yes`` that finds nothing of the person left is
  confirmed (``FORGOT_AT_RESTART``).
- ``!incognito``, ``!reset`` and ``!forget`` end the incognito stretch here at once and for
  every gateway in the store (a refused one ends nothing); ``!reset``/``!forget`` also stop
  any fold in flight from writing or sending what was said.
- A full radio queue runs no command (the person is told to try again, stored); a hold runs it
  and its reply waits in the outbox.
- The reply is an outbox row released with the held command in one write (a kill never
  leaves the reply queued and the command held), except exports: files cannot wait in the
  outbox, so they are sent now, once.
- ``!more`` under an answer cut at ``max_tokens`` (``CommandResult.go_on``) is a turn
  (``Answerer.go_on``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bot.answering import Answerer, cut
from bot.commands import UNLIMITED_ROOM, CommandResult, Commands
from bot.delivery import OutboxSender, busy_now
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply, ReplyKind
from bot.memory.port import MemoryStore
from bot.memory.records import OutboxEntry
from bot.memory.stretch import HeldStretches
from bot.memory.summary import Summarizer
from bot.notice_lanes import busy_text
from bot.restarts import DONE_AT_RESTART, FORGOT_AT_RESTART, HeldCommands, Lateness
from bot.text import MESH_COMMAND_BYTES
from bot.transports.base import KeepsFiles, Transport

log = logging.getLogger("bot.command_turns")

ENDS_INCOGNITO = ("incognito", "reset", "forget")  # commands that end an incognito stretch


def command_room(transport: Transport) -> int:
    """Bytes a command reply may use: one packet on the mesh (airtime), otherwise what one
    answer carries on the transport (``fit`` of a long text: Discord 2,000 characters)."""
    if transport.name == "meshtastic":
        return MESH_COMMAND_BYTES
    return len(transport.fit("x" * UNLIMITED_ROOM).encode("utf-8"))


class CommandTurns:
    """Runs commands for the queue (see the module docstring)."""

    def __init__(
        self,
        *,
        commands: Commands,
        store: MemoryStore,
        transports: Mapping[str, Transport],
        outbox: OutboxSender,
        summarizer: Summarizer,
        stretches: HeldStretches,
        answerer: Answerer,
        lateness: Lateness,
        held: HeldCommands,
    ) -> None:
        self._commands = commands
        self._store = store
        self._transports = transports
        self._outbox = outbox
        self._summarizer = summarizer
        self._stretches = stretches
        self._answerer = answerer  # ``!more`` after a cut goes on as a turn
        self._lateness = lateness
        self._held = held
        self._events = 0  # commands started or finished, any person
        self._running = 0  # commands running now

    @property
    def events(self) -> int:
        """Commands started or finished so far (any person)."""
        return self._events

    @property
    def running(self) -> int:
        return self._running

    async def run(
        self, inbound: Inbound, *, command_id: int | None, done: bool, recovered: bool
    ) -> None:
        """Run the command (counted in ``events``), then release its hold."""
        self._events += 1
        self._running += 1
        try:
            await self._command(inbound, recovered=recovered, command_id=command_id, done=done)
        finally:
            self._running -= 1
            self._events += 1
        await self._held.release(command_id)

    async def failed(self, inbound: Inbound, command_id: int | None) -> None:
        """A command that crashed: released (never run and crash again) and told."""
        await self._answerer.failed(inbound, command_id=command_id)

    async def _command(
        self,
        inbound: Inbound,
        *,
        recovered: bool = False,
        command_id: int | None = None,
        done: bool = False,
    ) -> None:
        parsed = self._commands.parse(inbound.text)
        assert parsed is not None
        if done:  # its effect committed before a kill (bot.commands): told, never applied twice
            text = DONE_AT_RESTART.format(command=self._commands.prefix + parsed[0])
            await self._lateness.told_at_restart(inbound, text, command_id)
            return
        confirm = parsed[0] == "forget" and parsed[1].lower() == "yes"
        if (  # killed during or after the delete: nothing of the person is left
            recovered
            and confirm
            and not await self._store.conversations_of(inbound.transport, inbound.sender)
        ):
            await self._lateness.told_at_restart(inbound, FORGOT_AT_RESTART, command_id)
            return
        if parsed[0] in ENDS_INCOGNITO and self._commands.allowed(inbound, parsed[0]):
            # here at once, and for every gateway in the store (a refused one ends nothing)
            everywhere = parsed[0] == "forget"
            self._stretches.drop(inbound.key, every_space=everywhere)
            if parsed[0] != "incognito":  # no fold in flight may write or send what was said
                self._summarizer.forget(
                    inbound.transport, inbound.sender, space=None if everywhere else inbound.space
                )
            await self._store.end_incognito(
                inbound.transport, inbound.sender, space=None if everywhere else inbound.space
            )
        transport = self._transports[inbound.transport]
        busy = busy_now(transport)
        if busy is not None and busy.cause == "queue":  # not run: told to try again (stored)
            await self._outbox.busy_notice(inbound, busy_text(busy.seconds), question_id=None)
            return
        if busy is not None:  # a hold: run it, its reply waits in the outbox
            await self._outbox.tell_held(inbound, busy)
        result = await self._commands.run(
            inbound, *parsed, room=command_room(transport), command_id=command_id
        )
        if result.go_on:  # !more under an answer cut at max_tokens: a turn that goes on
            await self._answerer.go_on(inbound, result.text, command_id)
            return
        if result.forgot and isinstance(transport, KeepsFiles):
            removed = transport.forget(inbound.sender)
            if removed:
                log.info("removed %d file(s) written for %s", removed, inbound.key)
        if result.attachments:  # files cannot wait in the outbox: sent now, once
            delivery = await self._outbox.send(
                Reply(
                    inbound=inbound,
                    text=transport.fit(result.text),
                    kind=ReplyKind.COMMAND,
                    attachments=result.attachments,
                )
            )
            _after_delivery(result, delivery)
            return
        text, rest = cut(transport, result.text)
        entry = OutboxEntry(
            key=inbound.key,
            kind="more" if result.more else "command",
            text=text,
            reply_to=inbound.message_id,
            rest=rest,
        )
        # released in the same write: a kill never leaves the reply queued and the command held
        row = await self._store.queue_claimed(entry, release=command_id)
        delivery = await self._outbox.deliver_now(inbound, row)
        _after_delivery(result, delivery)


def _after_delivery(result: CommandResult, delivery: Delivery) -> None:
    if result.on_delivered is not None and delivery.status in (
        DeliveryStatus.DELIVERED,
        DeliveryStatus.SENT,
    ):
        result.on_delivered()
