"""The turn pipeline: inbound message -> stored -> (command | context -> LLM) -> outbox -> sent.

Invariants:
- The inbound message is persisted before anything else (status ``pending``), so a crash or a
  shutdown loses nothing; pending messages are picked up again at the next start, each for
  its own answer (``bot.recovery``, which the responder inherits). Commands are held in the
  store until their reply is queued, so one lost to a kill runs at the next start.
- A turn reads its conversation once: the row read at intake, if nothing ran for the person
  and no command of anyone's started, ended or was running since (``_Job.conv``: commands are
  what change conversation rows, a ``!link`` on one transport the row of another), else again
  when the turn starts.
- Per conversation, jobs (messages, commands, deliveries of stored answers) run one at a time,
  in arrival order, by a worker task that exits when its queue is empty; different
  conversations run at once. A person's next message is answered only after the previous
  answer was handed over (delivered, or given up), and its prompt includes every earlier
  question *and its answer* (``recent_messages(before_id=...)``). Each message gets its own
  answer; several waiting messages are never merged (they may be about different things).
- Commands count against the same per-person rate and queue limits as messages.
- Across gateways sharing one store, a conversation's turns hold the store's ``turn_lock``
  and answer only a message still ``pending`` (answered once); a message another gateway
  stored already (``AlreadyStored``) is dropped quietly.
- LLM calls go through the gate's foreground lane (bounded; summaries yield to replies).
  The prompt budget is the transport's ``context_tokens`` or less: what the server holds, as
  learned (``bot.llm.server_limits``), minus the answer. A server that refuses the prompt as
  too long (``ContextTooLong``, in any form) is never an outage: its limits are looked up
  again, and the prompt is rebuilt smaller (the learned room, or two thirds of the tokens,
  whichever is less) and asked again, up to ``MAX_SHRINKS`` times; if even the smallest is
  refused, the person hears why (``TOO_LONG``), not "LLM unavailable". Before calling the LLM
  (or running a command), a congested transport (the mesh outbox) is asked for room
  (``Busy``): a full queue gets the person a stored one-packet "busy, try again in N min" (an
  outbox row, the question ``limited``) and no LLM call; a hold (duty cycle spent, channel
  busy) gets a notice naming the cause, when one can still go out, and the question is
  answered into the outbox, sent when there is room (``delivery.max_age`` applies; an expired
  row tells the person).
- A person over the queue limit or the rate limit (``bot.limits``) gets one polite notice per
  limit window; their message is still stored (status ``limited``) and never answered by the
  LLM.
- The durable outbox: the model's whole answer (the assistant turn), the question's
  ``answered`` mark and an outbox row holding exactly what the transport sends are one
  transaction. The row is created already claimed (``queue_claimed``, which returns it, so
  no second read) and sent by
  the composed ``OutboxSender`` (``bot.delivery``, which keeps the delivery invariants: parts
  recorded, at most once under the store's claim, expiry, streams finishing their row).
  ``redeliver`` (at start and on every maintenance tick) queues the rows still waiting behind
  their person's jobs; ``recover_pending`` first releases the claims a dead process left.
- Notices (rate limited, busy, not stored) are never stored as something the model said.
  They are sent straight away, never behind the LLM; on a paced radio (``Congested``) intake
  notices are outbox rows sent in the person's notice lane (``bot.notice_lanes``), beside
  their turns, so the radio's receive loop never waits for airtime and a notice never waits
  behind the person's held answer; any notice that could not go out is stored and sent by a
  later round (``bot.delivery``). A question that arrives during a hold while the person's
  worker is busy is told of the hold at once, in the lane (its turn then does not tell
  again). "LLM unavailable" is an outbox row (it settles the question as ``failed`` in the
  same transaction). Command replies are outbox rows too (except exports, whose files cannot
  be stored there); commands and their replies are not part of the conversation log.
- Streaming (transports with ``Streams``, Discord): the growing answer is shown while the LLM
  writes; once the outbox row exists, the stream finishes it instead of a second send
  (``bot.delivery``). An LLM failure aborts the stream (what was shown is removed) before the
  notice. Images (``Inbound.images``) go to the model with the new message only; they are
  never stored.
- Every background task is owned (``self._workers``, the notice lanes) and ``drain`` waits
  for them with a timeout.
- Incognito (``!incognito``): the person's new messages and the answers are not stored; the
  bot answers from the stored memory plus the incognito turns it holds in memory (at most
  ``INCOGNITO_TURNS``), which are dropped when incognito ends (any ``!incognito``, ``!reset``
  or ``!forget``, on any gateway sharing the store, through any linked account) or the process
  stops: nothing said in an ended stretch reaches a later prompt (``bot.memory.stretch``: each
  incognito turn checks the store's stretch id).
- A message whose sender may not use its memory (``bot.trust``: an unauthenticated mesh DM,
  unless ``meshtastic.unauthenticated_dm: memory``) is answered like an incognito turn over a
  blank memory: nothing of that node id's memory is read, nothing is stored.
- An edit (``Inbound.edited``) changes what is stored, never adds a message (``_edited``).
- A message through a linked DM is stored with its origin (``Conversation.origin_id``), so
  ``!unlink`` can give it back, even when the unlink lands during the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from bot.answering import (
    ANSWER_NOT_STORED,
    BUSY,
    EMPTY,
    INTERNAL_ERROR,
    NOT_STORED,
    TRIMMED_NOTE,
    UNAVAILABLE,
    UNREADABLE,
    WITHDRAWN,
    Answering,
    _busy,
)
from bot.chat_settings import ChatSettings
from bot.clock import ClockWatch
from bot.commands import UNLIMITED_ROOM, CommandResult, Commands
from bot.config import BotConfig
from bot.delivery import OutboxSender, busy_now
from bot.domain import Delivery, DeliveryStatus, Inbound, Reply, ReplyKind
from bot.errors import StorageError
from bot.fitting import FittingAsk
from bot.limits import PersonLimits
from bot.llm.port import LLM, MODEL_CHOICE
from bot.llm.server_limits import LearnedLimits
from bot.llm.tokens import TokenCounter
from bot.memory.indexer import Indexer
from bot.memory.layers import LayeredContext
from bot.memory.port import MemoryStore
from bot.memory.records import (
    AlreadyStored,
    Conversation,
    OutboxEntry,
    OutboxRow,
)
from bot.memory.store import USER
from bot.memory.stretch import HeldStretches
from bot.memory.summary import Summarizer
from bot.notice_lanes import NoticeIntake, NoticeLanes
from bot.ops.metrics import Counters
from bot.recovery import DONE_AT_RESTART, FORGOT_AT_RESTART
from bot.text import MESH_COMMAND_BYTES, clean_inbound
from bot.transports.base import (
    KeepsFiles,
    Rereads,
    Transport,
)

__all__ = [
    "ANSWER_NOT_STORED",
    "BUSY",
    "EMPTY",
    "INTERNAL_ERROR",
    "NOT_STORED",
    "TRIMMED_NOTE",
    "UNAVAILABLE",
    "UNREADABLE",
    "WITHDRAWN",
    "Responder",
]

log = logging.getLogger("bot.responder")


def _command_room(transport: Transport) -> int:
    """Bytes a command reply may use: one packet on the mesh (airtime), otherwise what one
    answer carries on the transport (``fit`` of a long text: Discord 2,000 characters)."""
    if transport.name == "meshtastic":
        return MESH_COMMAND_BYTES
    return len(transport.fit("x" * UNLIMITED_ROOM).encode("utf-8"))


ENDS_INCOGNITO = ("incognito", "reset", "forget")  # commands that end an incognito stretch


@dataclass(frozen=True, slots=True)
class _Job:
    inbound: Inbound
    message_id: int | None = None  # a stored message to answer
    command: bool = False
    outbox: OutboxRow | None = None  # a stored delivery to (re)send
    incognito: bool = False  # answered from memory, nothing stored
    bare: bool = False  # (with incognito) answered from no memory at all (bot.trust)
    # stored before a restart or by a gateway that died: the transport may reread it (images)
    recovered: bool = False
    command_id: int | None = None  # the command as held in the store until answered
    command_done: bool = False  # held, its effect committed before a kill: told, not re-run
    # The conversation as read at intake, kept only for a job that runs next with no command
    # started, ended or running since the read (commands are what change conversation rows):
    # its turn needs no second read.
    conv: Conversation | None = None


class Responder(NoticeIntake, Answering):
    def __init__(
        self,
        *,
        store: MemoryStore,
        llm: LLM,
        context: LayeredContext,
        summarizer: Summarizer,
        commands: Commands,
        counter: TokenCounter,
        config: BotConfig,
        indexer: Indexer | None = None,
        max_age: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        server: LearnedLimits | None = None,
        settings: ChatSettings | None = None,
        counters: Counters | None = None,
        trust: ClockWatch | None = None,
        unavailable: str = UNAVAILABLE,  # the notice when no endpoint answered (app: its URL)
    ) -> None:
        self._unavailable = unavailable
        self._writing: set[tuple[str, str, str]] = set()  # answers being written (stoppable)
        self._stop_asked: set[tuple[str, str, str]] = set()
        self._settings = settings  # model and persona per channel, server, bot or person
        self.counters = counters or Counters()  # totals for the operator's view (counts only)
        self._store = store
        self._wall = wall  # dates of answers and what counts as recent (bench: replayed dates)
        self._llm = llm
        self._context = context
        # Every LLM call: a prompt within what the server holds, rebuilt smaller on overflow.
        self._fit = FittingAsk(llm=llm, context=context, server=server, config=config)
        self._summarizer = summarizer
        self._indexer = indexer
        self._commands = commands
        self._counter = counter
        self._config = config
        self._limits = PersonLimits(config=config, clock=clock)
        self._transports: dict[str, Transport] = {}
        self._outbox = OutboxSender(
            store=store, transports=self._transports, max_age=max_age, clock=clock, trust=trust
        )
        self._trust = self._outbox.trust  # whether wall-clock ages may be acted on
        self._outbox.first_part = self.counters.first_part_sent
        self._queues: dict[tuple[str, str, str], deque[_Job]] = {}
        self._workers: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # Commands started or finished, any person, and how many run now (see _Job.conv).
        self._command_events = 0
        self._commands_running = 0
        self._accepting = True
        self._stretches = HeldStretches()
        self._max_age = dict(max_age or {})
        self._questions: set[int] = set()  # stored questions queued or answered here now
        self._lanes = NoticeLanes()  # a person's notices beside their turns (paced radios)
        self._told: set[int] = set()  # questions told of a hold in their lane (not again)
        self._held_here: set[int] = set()  # commands this process held (recovery skips them)

    @property
    def command_events(self) -> int:
        """Commands started or finished so far: the LLM gate counts a person at work by it."""
        return self._command_events

    def attach(self, transport: Transport) -> None:
        self._transports[transport.name] = transport

    # --- intake -----------------------------------------------------------------------------
    async def handle(self, inbound: Inbound) -> None:
        """Called by transports. Returns once the message is stored and queued."""
        text = clean_inbound(inbound.text)
        inbound = replace(inbound, text=text)
        if not text.replace("\ufffd", "").strip():  # nothing, or only bytes that were not text
            unreadable = UNREADABLE if "\ufffd" in text else EMPTY
            await self._intake_notice(inbound, unreadable.format(prefix=self._commands.prefix))
            return
        if inbound.edited:
            await self._edited(inbound)
            return
        limited = self._over_limit(inbound)
        if self._commands.parse(text) is not None:
            if limited:  # commands obey the same limits: a flood of them gets one notice
                await self._notice_once(inbound, limited)
                return
            held = await self._hold_command(inbound)  # a kill now: run at the next start
            if self._accepting:  # (during shutdown: held for the next start)
                self._enqueue(_Job(inbound, command=True, command_id=held))
            return
        if not self._commands.trust.may_use_memory(inbound):  # bot.trust: a blank memory
            if limited:
                await self._notice_once(inbound, limited)
            elif self._accepting:
                self._enqueue(_Job(inbound, incognito=True, bare=True))
            return
        commands_before = self._command_events
        try:
            conv = await self._store.conversation(inbound.key)
            if conv.incognito:  # read with the conversation: one round trip
                if limited:
                    await self._notice_once(inbound, limited)
                elif self._accepting:
                    self._enqueue(_Job(inbound, incognito=True))
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
            await self._notice(inbound, NOT_STORED)
            return
        if limited:
            self.counters.add("limited")
            await self._notice_once(inbound, limited)
            return
        if not self._accepting:
            return  # stored as pending; answered after the restart
        key = inbound.key  # a person with a worker: this job runs after what it has queued
        idle = (key.transport, key.person, key.space) not in self._workers
        quiet = commands_before == self._command_events and not self._commands_running
        fresh = idle and quiet
        if not idle:  # the worker may wait on a held answer: told now, in the lane
            if await self._refuse_early(inbound, message_id):
                self.counters.add("limited")
                return
            self._tell_early(inbound, message_id)
        self._enqueue(_Job(inbound, message_id, conv=conv if fresh else None))

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
                    reopen=not inbound.edit_only and self._accepting,
                    withdrawn=WITHDRAWN,
                )
        except (sqlite3.Error, StorageError) as exc:
            log.error("could not store an edit from %s: %s", inbound.key, exc)
            await self._notice(inbound, NOT_STORED)
            return
        if edited is None:
            if not inbound.edit_only:  # e.g. a mention added: answered as a new message
                await self.handle(replace(inbound, edited=False))
            return
        log.info("message %d in %s edited", edited.message.id, inbound.key)
        fresh = replace(inbound, edited=False)
        key = inbound.key
        queue = self._queues.get((key.transport, key.person, key.space))
        if edited.old_status == "pending" and queue:
            for i, job in enumerate(queue):  # not yet answered: it is answered as edited
                if i and job.message_id == edited.message.id:
                    queue[i] = replace(job, inbound=fresh, conv=None)
        elif edited.reopened:
            self._enqueue(_Job(fresh, edited.message.id))

    def _persona(self, inbound: Inbound) -> str | None:
        """The persona's prompt chosen for this conversation (None: ``bot.system_prompt``)."""
        return None if self._settings is None else self._settings.persona(inbound)[1]

    def _over_limit(self, inbound: Inbound) -> str | None:
        if self._commands.is_operator(inbound):
            return None
        who = (inbound.transport, inbound.sender)
        queued = sum(
            sum(1 for job in q if job.outbox is None)
            for key, q in self._queues.items()
            if key[:2] == who
        )
        return self._limits.over(who, queued=queued)

    def _enqueue_recovered(
        self,
        inbound: Inbound,
        *,
        message_id: int | None = None,
        command_id: int | None = None,
        done: bool = False,
    ) -> None:
        if command_id is not None:
            held = _Job(inbound, command=True, command_id=command_id, command_done=done)
            self._enqueue(replace(held, recovered=True))
        else:
            self._enqueue(_Job(inbound, message_id, recovered=True))

    def _enqueue(self, job: _Job) -> None:
        key = job.inbound.key
        qkey = (key.transport, key.person, key.space)
        if job.outbox is not None:
            self._outbox.in_flight.add(job.outbox.id)
        if job.message_id is not None:
            self._questions.add(job.message_id)
        queue = self._queues.setdefault(qkey, deque())
        if job.recovered and (mine := job.message_id) is not None:
            # before the person's later questions not started yet (heard live before recovery
            # ran): each answer in the order the questions were asked
            later = (i for i in range(1, len(queue)) if (queue[i].message_id or 0) > mine)
            queue.insert(next(later, len(queue)), job)
        else:
            queue.append(job)
        if qkey not in self._workers:
            self._idle.clear()
            task = asyncio.create_task(self._work(qkey), name=f"turns {key}")
            self._workers[qkey] = task

    async def _work(self, qkey: tuple[str, str, str]) -> None:
        queue = self._queues[qkey]
        try:
            while queue:
                job = queue[0]
                if not self._accepting and job.outbox is not None:
                    break  # shutting down: the row stays in the outbox for the next start
                # the model chosen for this conversation, for every LLM call of this job
                chosen = MODEL_CHOICE.set(
                    None if self._settings is None else self._settings.model(job.inbound)
                )
                try:
                    if job.outbox is not None:
                        await self._outbox.deliver(job.inbound, job.outbox)
                    elif job.command:
                        self._command_events += 1
                        self._commands_running += 1
                        try:
                            await self._command(job.inbound, recovered=job.recovered,
                                                command_id=job.command_id,
                                                done=job.command_done)  # fmt: skip
                        finally:
                            self._commands_running -= 1
                            self._command_events += 1
                        await self._release_command(job.command_id)
                    elif job.incognito:
                        await self._incognito_turn(job.inbound, bare=job.bare)
                    else:
                        assert job.message_id is not None
                        inbound = job.inbound
                        transport = self._transports.get(inbound.transport)
                        if job.recovered and isinstance(transport, Rereads):
                            inbound = await transport.reread(inbound)  # images, not stored
                        await self._turn(inbound, job.message_id, job.conv, recovered=job.recovered)
                except Exception:  # loop boundary: one bad turn must not stop this person's queue
                    log.exception("turn failed in %s", job.inbound.key)
                    await self._after_failure(job)
                finally:
                    MODEL_CHOICE.reset(chosen)
                    queue.popleft()
                    if job.message_id is not None:
                        self._questions.discard(job.message_id)
                        self._told.discard(job.message_id)
                    if job.outbox is not None:
                        self._outbox.in_flight.discard(job.outbox.id)
        finally:
            self._queues.pop(qkey, None)
            self._workers.pop(qkey, None)
            if not self._workers:
                self._idle.set()

    # --- turns ------------------------------------------------------------------------------
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
            await self._told_at_restart(inbound, text, command_id)
            return
        confirm = parsed[0] == "forget" and parsed[1].lower() == "yes"
        if (  # killed during or after the delete: nothing of the person is left
            recovered
            and confirm
            and not await self._store.conversations_of(inbound.transport, inbound.sender)
        ):
            await self._told_at_restart(inbound, FORGOT_AT_RESTART, command_id)
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
            await self._outbox.busy_notice(inbound, _busy(busy.seconds), question_id=None)
            return
        if busy is not None:  # a hold: run it, its reply waits in the outbox
            await self._outbox.tell_held(inbound, busy)
        result = await self._commands.run(
            inbound, *parsed, room=_command_room(transport), command_id=command_id
        )
        if result.go_on:  # !more under an answer cut at max_tokens: a turn that goes on
            await self._go_on(inbound, result.text, command_id)
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
            self._after_delivery(result, delivery)
            return
        text, rest = self._cut(transport, result.text)
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
        self._after_delivery(result, delivery)

    @staticmethod
    def _after_delivery(result: CommandResult, delivery: Delivery) -> None:
        if result.on_delivered is not None and delivery.status in (
            DeliveryStatus.DELIVERED,
            DeliveryStatus.SENT,
        ):
            result.on_delivered()

    async def _after_failure(self, job: _Job) -> None:
        """A turn that crashed: tell the person briefly (first: the store may be what failed)
        and mark the message failed, so it is not retried (and crashing again) at every
        restart."""
        if job.outbox is not None:  # a delivery that crashed: end the row, never loop on it
            await self._outbox.fail(job.outbox.id)
            return
        if job.command_id is not None:  # told below: never run (and crash) again
            with contextlib.suppress(Exception):  # loop boundary: the store may have failed
                await self._store.release_command(job.command_id)
        try:
            await self._notice(job.inbound, INTERNAL_ERROR)
        except Exception:  # loop boundary: the transport may be what failed
            log.exception("could not tell %s about the failed turn", job.inbound.key)
        try:
            if job.message_id is not None:
                await self._store.set_status(job.message_id, "failed")
        except Exception:  # loop boundary: the store may be what failed (disk full)
            log.exception("could not mark the failed turn in %s", job.inbound.key)

    async def _notice(self, inbound: Inbound, text: str) -> None:
        self.counters.add("notices")
        await self._outbox.notice(inbound, text)

    # --- lifecycle --------------------------------------------------------------------------
    async def redeliver(self) -> int:
        """Queue every undelivered outbox row that is not already on its way (its person's
        worker sends it in order; expired rows are marked so). Returns how many."""
        if not self._accepting:
            return 0
        n = 0
        for inbound, row in await self._outbox.waiting():
            self._enqueue(_Job(inbound, outbox=row))
            n += 1
        if n:
            log.info("sending %d undelivered reply(ies) from the outbox", n)
        return n

    def waiting(self) -> tuple[int, int]:
        """(people with turns queued or running, turns queued or running): counts only."""
        people = {key[:2] for key, q in self._queues.items() if q}
        return len(people), sum(len(q) for q in self._queues.values())

    @property
    def idle(self) -> bool:
        return self._idle.is_set() and self._lanes.idle

    async def wait_idle(self) -> None:
        while not self.idle:
            await self._idle.wait()
            await self._lanes.wait_idle()

    async def drain(self, *, timeout: float) -> None:
        """Stop taking new turns; finish the ones in flight (up to ``timeout``). Replies cut
        off here stay in the outbox and go out after the restart."""
        self._accepting = False
        await self._lanes.stop()  # notices only: a stored one goes out after the restart
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        # Wait for LLM calls and stores in flight; a worker only waiting for its transport
        # to deliver is cut at once (its row stays pending, sent at the next start), so a long
        # mesh queue never makes a shutdown slow.
        while self._workers and loop.time() < end:
            if set(self._workers) <= self._outbox.delivering:
                break
            await asyncio.wait(list(self._workers.values()), timeout=0.05)
        workers = list(self._workers.values())
        if workers:
            _done, pending = await asyncio.wait(workers, timeout=0)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d conversation(s) cut off at shutdown", len(pending))
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*pending, return_exceptions=True)
