"""The jobs of a conversation's queue (``bot.turn_queue``): each a frozen value that names the
part that runs it and says what it is about.

- ``DeliverJob``: a stored outbox row (re)sent by the ``OutboxSender``.
- ``CommandJob``: a command, held in the store until answered (``bot.command_turns``).
- ``IncognitoJob``: a message answered from memory with nothing stored (``bare``: from no
  memory at all, a sender who may not use it, ``bot.trust``).
- ``TurnJob``: a stored question answered by the ``Answerer``.

Invariants:
- A job's ``failed`` (after its ``run`` raised) ends what it stands for: a delivery's row is
  ended (never looped on), a command is released and its person told, a question is marked
  ``failed`` and its person told.
- ``TurnJob.conv`` is the conversation as read at intake, kept only for a job that runs next
  with no command started, ended or running since the read (commands are what change
  conversation rows): its turn needs no second read.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.answering import Answerer
from bot.command_turns import CommandTurns
from bot.delivery import OutboxSender
from bot.domain import Inbound
from bot.memory.records import Conversation, OutboxRow


@dataclass(frozen=True, slots=True)
class DeliverJob:
    inbound: Inbound
    row: OutboxRow
    outbox: OutboxSender

    @property
    def question(self) -> int | None:
        return None

    @property
    def recovered(self) -> bool:
        return False

    async def run(self) -> None:
        await self.outbox.deliver(self.inbound, self.row)

    async def failed(self) -> None:
        await self.outbox.fail(self.row.id)  # a delivery that crashed: never loop on it


@dataclass(frozen=True, slots=True)
class CommandJob:
    inbound: Inbound
    runner: CommandTurns
    command_id: int | None = None  # the command as held in the store until answered
    done: bool = False  # held, its effect committed before a kill: told, not re-run
    recovered: bool = False

    @property
    def question(self) -> int | None:
        return None

    @property
    def row(self) -> OutboxRow | None:
        return None

    async def run(self) -> None:
        await self.runner.run(
            self.inbound, command_id=self.command_id, done=self.done, recovered=self.recovered
        )

    async def failed(self) -> None:
        await self.runner.failed(self.inbound, self.command_id)


@dataclass(frozen=True, slots=True)
class IncognitoJob:
    inbound: Inbound
    answerer: Answerer
    bare: bool = False  # answered from no memory at all (bot.trust)

    @property
    def question(self) -> int | None:
        return None

    @property
    def row(self) -> OutboxRow | None:
        return None

    @property
    def recovered(self) -> bool:
        return False

    async def run(self) -> None:
        await self.answerer.incognito_turn(self.inbound, bare=self.bare)

    async def failed(self) -> None:
        await self.answerer.failed(self.inbound)


@dataclass(frozen=True, slots=True)
class TurnJob:
    inbound: Inbound
    message_id: int  # the stored question
    answerer: Answerer
    conv: Conversation | None = None  # as read at intake (see the module docstring)
    # stored before a restart or by a gateway that died: the transport may reread it (images)
    recovered: bool = False

    @property
    def question(self) -> int | None:
        return self.message_id

    @property
    def row(self) -> OutboxRow | None:
        return None

    async def run(self) -> None:
        await self.answerer.turn(self.inbound, self.message_id, self.conv, recovered=self.recovered)

    async def failed(self) -> None:
        await self.answerer.failed(self.inbound, message_id=self.message_id)
