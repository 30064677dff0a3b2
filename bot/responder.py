"""The turn pipeline: inbound message -> stored -> (command | context -> LLM) -> outbox -> sent.

``Responder`` is the façade transports and the app call; ``build_responder`` composes the parts,
each owning its state: ``Intake`` (``bot.intake``: admission, limits, edits) puts jobs
(``bot.turn_jobs``: deliver, command, incognito, turn) on the ``TurnQueue`` (``bot.turn_queue``:
one worker per conversation); a job runs in its part: the ``Answerer`` (``bot.answering``),
``CommandTurns`` (``bot.command_turns``), the ``OutboxSender`` (``bot.delivery``); ``Notices``
(``bot.notice_lanes``) send the notices; ``Recovery`` (``bot.recovery``, ``bot.restarts``)
queues what a restart left.

Invariants:
- The inbound message is persisted before anything else (status ``pending``), so a crash or a
  shutdown loses nothing; pending messages are picked up again at the next start, each for
  its own answer (``bot.recovery``). Commands are held in the
  store until their reply is queued, so one lost to a kill runs at the next start.
- A turn reads its conversation once: the row read at intake, if nothing ran for the person
  and no command of anyone's started, ended or was running since (``TurnJob.conv``: commands are
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
- Every background task is owned (the queue's workers, the notice lanes) and ``drain`` waits
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
- An edit (``Inbound.edited``) changes what is stored, never adds a message (``bot.intake``).
- A message through a linked DM is stored with its origin (``Conversation.origin_id``), so
  ``!unlink`` can give it back, even when the unlink lands during the turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bot.answering import (
    ANSWER_NOT_STORED,
    EMPTY,
    INTERNAL_ERROR,
    NOT_STORED,
    TRIMMED_NOTE,
    UNAVAILABLE,
    UNREADABLE,
    WITHDRAWN,
    Answerer,
)
from bot.chat_settings import ChatSettings
from bot.clock import ClockWatch
from bot.command_turns import CommandTurns
from bot.commands import Commands
from bot.config import BotConfig
from bot.delivery import OutboxSender
from bot.domain import Inbound
from bot.fitting import FittingAsk
from bot.intake import Intake
from bot.limits import PersonLimits
from bot.llm.port import LLM
from bot.llm.server_limits import LearnedLimits
from bot.llm.tokens import TokenCounter
from bot.memory.indexer import Indexer
from bot.memory.layers import LayeredContext
from bot.memory.port import MemoryStore
from bot.memory.stretch import HeldStretches
from bot.memory.summary import Summarizer
from bot.notice_lanes import BUSY, NoticeLanes, Notices
from bot.ops.metrics import Counters
from bot.recovery import Recovery
from bot.restarts import HeldCommands, Lateness
from bot.transports.base import Transport
from bot.turn_queue import TurnQueue

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
    "Pipeline",
    "Responder",
    "build_responder",
]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The composed parts of the turn pipeline (``build_responder`` makes them)."""

    transports: dict[str, Transport]  # the attached transports, by name (shared table)
    queue: TurnQueue
    intake: Intake
    answerer: Answerer
    command_turns: CommandTurns
    recovery: Recovery
    notices: Notices
    lanes: NoticeLanes
    outbox: OutboxSender
    llm: LLM  # what every turn asks (through ``FittingAsk``)
    counters: Counters


class Responder:
    """The turn pipeline as transports and the app see it (see the module docstring)."""

    def __init__(self, *, parts: Pipeline) -> None:
        self.parts = parts
        self.counters = parts.counters  # totals for the operator's view (counts only)

    @property
    def command_events(self) -> int:
        """Commands started or finished so far: the LLM gate counts a person at work by it."""
        return self.parts.command_turns.events

    def attach(self, transport: Transport) -> None:
        self.parts.transports[transport.name] = transport

    async def handle(self, inbound: Inbound) -> None:
        """Called by transports. Returns once the message is stored and queued."""
        await self.parts.intake.take(inbound)

    def stop_answers(self, transport: str) -> int:
        """Stop the answers being written now for people on ``transport`` (the console's
        Ctrl-C). Returns how many were asked to stop (0: nothing was being written)."""
        return self.parts.answerer.stop_answers(transport)

    async def redeliver(self) -> int:
        """Queue every undelivered outbox row not already on its way. Returns how many."""
        return await self.parts.recovery.redeliver()

    async def recover_pending(self) -> int:
        """At start: what the outbox holds, the held commands, the pending questions."""
        return await self.parts.recovery.recover_pending()

    async def take_over_stale(self) -> int:
        """Every maintenance tick: the pending questions of a gateway that died."""
        return await self.parts.recovery.take_over_stale()

    def waiting(self) -> tuple[int, int]:
        """(people with turns queued or running, turns queued or running): counts only."""
        return self.parts.queue.waiting()

    @property
    def idle(self) -> bool:
        return self.parts.queue.idle and self.parts.lanes.idle

    async def wait_idle(self) -> None:
        while not self.idle:
            await self.parts.queue.wait_idle()
            await self.parts.lanes.wait_idle()

    async def drain(self, *, timeout: float) -> None:
        """Stop taking new turns; finish the ones in flight (up to ``timeout``). Replies cut
        off here stay in the outbox and go out after the restart."""
        self.parts.queue.close()
        await self.parts.lanes.stop()  # notices only: a stored one goes out after the restart
        await self.parts.queue.drain(timeout=timeout)


def build_responder(
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
) -> Responder:
    """Compose the turn pipeline: the one place its parts are made and handed to each other."""
    counters = counters or Counters()
    transports: dict[str, Transport] = {}  # filled by ``Responder.attach``
    outbox = OutboxSender(
        store=store,
        transports=transports,
        max_age=max_age,
        clock=clock,
        trust=trust,
        first_part=counters.first_part_sent,
    )
    queue = TurnQueue(outbox=outbox)
    lanes = NoticeLanes()  # a person's notices beside their turns (paced radios)
    limits = PersonLimits(config=config, clock=clock)
    notices = Notices(
        transports=transports,
        outbox=outbox,
        limits=limits,
        lanes=lanes,
        queue=queue,
        counters=counters,
    )
    lateness = Lateness(
        store=store, transports=transports, outbox=outbox, max_age=max_age, wall=wall
    )
    held = HeldCommands(store=store)
    stretches = HeldStretches()
    answerer = Answerer(
        store=store,
        transports=transports,
        outbox=outbox,
        fit=FittingAsk(llm=llm, context=context, server=server, config=config),
        summarizer=summarizer,
        counter=counter,
        config=config,
        counters=counters,
        notices=notices,
        lateness=lateness,
        stretches=stretches,
        prefix=commands.prefix,
        settings=settings,
        indexer=indexer,
        wall=wall,
        unavailable=unavailable,
    )
    command_turns = CommandTurns(
        commands=commands,
        store=store,
        transports=transports,
        outbox=outbox,
        summarizer=summarizer,
        stretches=stretches,
        answerer=answerer,
        lateness=lateness,
        held=held,
    )
    intake = Intake(
        store=store,
        commands=commands,
        counter=counter,
        counters=counters,
        limits=limits,
        stretches=stretches,
        queue=queue,
        notices=notices,
        held=held,
        answerer=answerer,
        command_turns=command_turns,
    )
    recovery = Recovery(
        store=store,
        transports=transports,
        outbox=outbox,
        queue=queue,
        held=held,
        answerer=answerer,
        command_turns=command_turns,
    )
    return Responder(
        parts=Pipeline(
            transports=transports,
            queue=queue,
            intake=intake,
            answerer=answerer,
            command_turns=command_turns,
            recovery=recovery,
            notices=notices,
            lanes=lanes,
            outbox=outbox,
            llm=llm,
            counters=counters,
        )
    )
