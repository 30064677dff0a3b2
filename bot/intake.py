"""The intake of the turn pipeline: a message from a transport becomes a stored question and a
job in its conversation's queue (``bot.turn_queue``), or a command held in the store, or an
incognito turn, or a notice.

Invariants (with those of ``bot.responder``, where the whole pipeline is described):
- The inbound message is persisted before anything else (status ``pending``, or ``limited``
  for a person over a limit, never answered by the LLM); a command is held in the store
  (``HeldCommands``) before it is queued. During shutdown nothing new is queued: what is stored
  is answered after the restart.
- Commands count against the same per-person rate and queue limits as messages; a person over
  a limit gets one notice per window (``bot.limits``, ``Notices.notice_once``).
- A message another gateway stored already (``AlreadyStored``) is dropped quietly.
- A turn keeps the conversation as read here only when its person had no worker and no
  command of anyone's started, ended or was running since the read (``TurnJob.conv``).
- An edit changes what is stored, never adds a message: a question still waiting is answered
  as edited, the newest question already answered is answered again when its words changed.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import replace

from bot.answering import EMPTY, NOT_STORED, UNREADABLE, WITHDRAWN, Answerer
from bot.command_turns import CommandTurns
from bot.commands import Commands
from bot.domain import Inbound
from bot.errors import StorageError
from bot.limits import PersonLimits
from bot.llm.tokens import TokenCounter
from bot.memory.port import MemoryStore
from bot.memory.records import AlreadyStored
from bot.memory.store import USER
from bot.memory.stretch import HeldStretches
from bot.notice_lanes import Notices
from bot.ops.metrics import Counters
from bot.restarts import HeldCommands
from bot.text import clean_inbound
from bot.turn_jobs import CommandJob, IncognitoJob, TurnJob
from bot.turn_queue import Job, TurnQueue

log = logging.getLogger("bot.intake")


class Intake:
    """Admits messages into the pipeline (see the module docstring)."""

    def __init__(
        self,
        *,
        store: MemoryStore,
        commands: Commands,
        counter: TokenCounter,
        counters: Counters,
        limits: PersonLimits,
        stretches: HeldStretches,
        queue: TurnQueue,
        notices: Notices,
        held: HeldCommands,
        answerer: Answerer,
        command_turns: CommandTurns,
    ) -> None:
        self._store = store
        self._commands = commands
        self._counter = counter
        self._counters = counters
        self._limits = limits
        self._stretches = stretches
        self._queue = queue
        self._notices = notices
        self._held = held
        self._answerer = answerer  # runs the turns and incognito turns queued here
        self._command_turns = command_turns  # runs the commands queued here

    async def take(self, inbound: Inbound) -> None:
        """Called by transports (through ``Responder``). Returns once the message is stored
        and queued."""
        text = clean_inbound(inbound.text)
        inbound = replace(inbound, text=text)
        if not text.replace("\ufffd", "").strip():  # nothing, or only bytes that were not text
            unreadable = UNREADABLE if "\ufffd" in text else EMPTY
            notice = unreadable.format(prefix=self._commands.prefix)
            await self._notices.intake_notice(inbound, notice)
            return
        if inbound.edited:
            await self._edited(inbound)
            return
        limited = self._over_limit(inbound)
        if self._commands.parse(text) is not None:
            if limited:  # commands obey the same limits: a flood of them gets one notice
                await self._notices.notice_once(inbound, limited)
                return
            held = await self._held.hold(inbound)  # a kill now: run at the next start
            if self._queue.accepting:  # (during shutdown: held for the next start)
                self._queue.put(CommandJob(inbound, self._command_turns, held))
            return
        if not self._commands.trust.may_use_memory(inbound):  # bot.trust: a blank memory
            if limited:
                await self._notices.notice_once(inbound, limited)
            elif self._queue.accepting:
                self._queue.put(IncognitoJob(inbound, self._answerer, bare=True))
            return
        commands_before = self._command_turns.events
        try:
            conv = await self._store.conversation(inbound.key)
            if conv.incognito:  # read with the conversation: one round trip
                if limited:
                    await self._notices.notice_once(inbound, limited)
                elif self._queue.accepting:
                    self._queue.put(IncognitoJob(inbound, self._answerer))
                return
            self._stretches.drop(inbound.key)  # incognito ended: forget its turns
            message_id = await self._store.add_message(
                conv.id,
                role=USER,
                author=inbound.sender_name or inbound.sender,
                text=text,
                tokens=self._counter.count(text),
                status="limited" if limited else "pending",
                created_at=inbound.received_at.timestamp(),
                platform_id=inbound.message_id,
                reply_to_platform_id=inbound.reply_to,
                origin_id=conv.origin_id,
            )
        except AlreadyStored:  # heard by another gateway too, which stored it and answers it
            log.debug("message %s from %s heard twice; answered once", inbound.message_id,
                      inbound.key)  # fmt: skip
            return
        except (sqlite3.Error, StorageError) as exc:  # disk full, locked, server unreachable
            log.error("could not store a message from %s: %s", inbound.key, exc)
            await self._notices.notice(inbound, NOT_STORED)
            return
        if limited:
            self._counters.add("limited")
            await self._notices.notice_once(inbound, limited)
            return
        if not self._queue.accepting:
            return  # stored as pending; answered after the restart
        # a person with a worker: this job runs after what it has queued
        idle = not self._queue.busy(inbound)
        quiet = commands_before == self._command_turns.events and not self._command_turns.running
        fresh = idle and quiet
        if not idle:  # the worker may wait on a held answer: told now, in the lane
            if await self._notices.refuse_early(inbound, message_id):
                self._counters.add("limited")
                return
            self._notices.tell_early(inbound, message_id)
        self._queue.put(TurnJob(inbound, message_id, self._answerer, conv=conv if fresh else None))

    async def _edited(self, inbound: Inbound) -> None:
        """The person edited an earlier message: the stored text follows (the old words leave
        memory and search); a question still waiting is answered as edited; the newest
        question, already answered, is answered again when its words changed (its old answer
        withdrawn from memory). An edit of a message never stored is a new message."""
        text = inbound.text
        if self._commands.parse(text) is not None or inbound.message_id is None:
            return  # commands are not stored, and an edit never runs one
        try:
            conv = await self._store.find_conversation(inbound.key)
            edited = None
            if conv is not None and not conv.incognito:
                edited = await self._store.edit_message(
                    conv.id,
                    inbound.message_id,
                    text=text,
                    tokens=self._counter.count(text),
                    reopen=not inbound.edit_only and self._queue.accepting,
                    withdrawn=WITHDRAWN,
                )
        except (sqlite3.Error, StorageError) as exc:
            log.error("could not store an edit from %s: %s", inbound.key, exc)
            await self._notices.notice(inbound, NOT_STORED)
            return
        if edited is None:
            if not inbound.edit_only:  # e.g. a mention added: answered as a new message
                await self.take(replace(inbound, edited=False))
            return
        log.info("message %d in %s edited", edited.message.id, inbound.key)
        fresh = replace(inbound, edited=False)
        if edited.old_status == "pending" and self._queue.busy(inbound):
            mine = edited.message.id

            def as_edited(job: Job) -> Job:  # not yet answered: it is answered as edited
                if isinstance(job, TurnJob) and job.message_id == mine:
                    return replace(job, inbound=fresh, conv=None)
                return job

            self._queue.update_waiting(inbound, as_edited)
        elif edited.reopened:
            self._queue.put(TurnJob(fresh, edited.message.id, self._answerer))

    def _over_limit(self, inbound: Inbound) -> str | None:
        if self._commands.is_operator(inbound):
            return None
        queued = self._queue.queued_for(inbound.transport, inbound.sender)
        return self._limits.over((inbound.transport, inbound.sender), queued=queued)
