"""Answering a claimed question (``bot.responder``): the prompt within what the server holds,
the LLM call, the answer stored with its outbox row in one transaction and delivered; and the
incognito turn, answered without storing anything.

Invariants: those of ``bot.responder`` for a turn (one answer per stored question, claimed
under the person's turn lock; a failed LLM call ends in a stored notice that settles the
question; a question forgotten meanwhile ends quietly). State lives in ``Responder``.
- The "LLM unavailable" notice names where the bot looked (the base URL, no password) and the
  fix, in one mesh packet (``unavailable_notice``: at most ``MESH_COMMAND_BYTES``).
- ``stop_answers`` (the console's Ctrl-C) stops only an answer being written: the LLM call is
  cancelled (closing the stream stops generation), the question is settled ``failed`` (never
  answered later, no notice), and the person's next job runs. A cancel from anyone else
  (shutdown) goes on up as before.
- ``!more`` under an answer cut at ``max_tokens`` (``CommandResult.go_on``) is a turn: the
  request to go on is stored as the person's message and answered like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import urlsplit

from bot.commands import Commands
from bot.config import BotConfig
from bot.delivery import busy_now
from bot.domain import Inbound, Reply, TransportLimits
from bot.errors import LLMUnavailable, StorageError
from bot.fitting import TOO_LONG, FittingAsk
from bot.llm.port import ChatMessage, ContextTooLong
from bot.llm.tokens import TokenCounter
from bot.memory.indexer import Indexer
from bot.memory.keep import CLAIM_STALE_SECONDS
from bot.memory.records import (
    Conversation,
    OutboxEntry,
    StoredAnswer,
)
from bot.memory.store import USER
from bot.memory.stretch import HeldStretches, Turns
from bot.memory.summary import FoldBase, Summarizer
from bot.ops.metrics import Counters
from bot.recovery import Recovery
from bot.text import MESH_COMMAND_BYTES, fit_bytes
from bot.transports.base import (
    AnswerStream,
    Paginates,
    Transport,
)
from bot.urls import redact

log = logging.getLogger("bot.responder")

UNAVAILABLE = "LLM unavailable, try again later."  # where the app did not say where it looked
UNAVAILABLE_AT = (
    "LLM unavailable: no answer from {where}. Operator: start the LLM server there, or set "
    "llm.base_url (`meshsage doctor` checks it). Try again later."
)
INTERNAL_ERROR = "Sorry, something went wrong on my side. Please try again."
WITHDRAWN = "(withdrawn: this answered the message before it was edited)"
EMPTY = "Your message was empty. Send some text, or {prefix}help for commands."
UNREADABLE = "I could not read your message (it was not valid text). Please send it again."
TRIMMED_NOTE = "your message was long; I read only its beginning"
NOT_STORED = "I could not save your message (storage problem), so I did not answer. Try later."
ANSWER_NOT_STORED = "I could not save my answer (storage problem). Please try again later."
BUSY = "Busy: many replies are waiting to go out. Try again in {minutes} min."
MIN_RETRY_BUDGET = 256  # a server refusing even this needs its context raised


def _speaker(inbound: Inbound, limits: TransportLimits) -> str | None:
    """The name the new message is shown under (shared spaces of transports that name their
    speakers); the same as the author it is stored with, so the next prompt reads it alike."""
    if not limits.names_speakers or inbound.is_dm:
        return None
    return inbound.sender_name or inbound.sender


def unavailable_notice(base_url: str, *, fallbacks: int = 0) -> str:
    """What a person hears when no endpoint answered: where the bot looked and the fix, in
    one mesh packet (a long URL is shortened to its host, never the fix cut)."""
    url = redact(base_url)
    more = f" (and {fallbacks} fallback{'s' if fallbacks != 1 else ''})" if fallbacks else ""
    for where in (url + more, url, _host(url)):
        text = UNAVAILABLE_AT.format(where=where)
        if len(text.encode("utf-8")) <= MESH_COMMAND_BYTES:
            return text
    room = MESH_COMMAND_BYTES - len(UNAVAILABLE_AT.format(where="").encode("utf-8"))
    return UNAVAILABLE_AT.format(where=fit_bytes(_host(url), room))


def _host(url: str) -> str:
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return url


class Answering(Recovery):
    """The answering half of ``Responder`` (state is set up in its ``__init__``)."""

    counters: Counters
    _unavailable: str  # the notice when no endpoint answered (``unavailable_notice``)
    _workers: dict[tuple[str, str, str], asyncio.Task[None]]
    _writing: set[tuple[str, str, str]]  # people whose answer is being written now
    _stop_asked: set[tuple[str, str, str]]  # ... and asked to stop (``stop_answers``)
    _config: BotConfig
    _summarizer: Summarizer
    _indexer: Indexer | None
    _fit: FittingAsk
    _commands: Commands
    _stretches: HeldStretches
    _counter: TokenCounter
    _told: set[int]  # questions told of a hold in their notice lane at intake

    def _persona(self, inbound: Inbound) -> str | None:
        raise NotImplementedError

    async def _notice(self, inbound: Inbound, text: str) -> None:
        raise NotImplementedError

    def _tell_early(self, inbound: Inbound, message_id: int) -> None:
        raise NotImplementedError

    @staticmethod
    def _cut(transport: Transport, text: str) -> tuple[str, str | None]:
        """What goes out now, and the rest for ``!more`` (transports that paginate)."""
        if isinstance(transport, Paginates):
            return transport.fit_more(text)
        return transport.fit(text), None

    def stop_answers(self, transport: str) -> int:
        """Stop the answers being written now for people on ``transport`` (the console's
        Ctrl-C). Returns how many were asked to stop (0: nothing was being written)."""
        n = 0
        for qkey in self._writing:
            if qkey[0] == transport and qkey not in self._stop_asked:
                self._stop_asked.add(qkey)
                self._workers[qkey].cancel()
                n += 1
        return n

    @contextlib.contextmanager
    def _writes(self, inbound: Inbound) -> Iterator[None]:
        """While the answer is being written: ``stop_answers`` may cancel it."""
        key = inbound.key
        qkey = (key.transport, key.person, key.space)
        self._writing.add(qkey)
        try:
            yield
        finally:
            self._writing.discard(qkey)

    def _was_stopped(self, inbound: Inbound) -> bool:
        """True (and the cancel taken back) when ``stop_answers`` cancelled this turn."""
        key = inbound.key
        qkey = (key.transport, key.person, key.space)
        if qkey not in self._stop_asked:
            return False
        self._stop_asked.discard(qkey)
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        log.info("the answer for %s was stopped by the person", key)
        return True

    async def _go_on(self, inbound: Inbound, ask: str, command_id: int | None) -> None:
        """``!more`` under an answer cut at max_tokens: ``ask`` is stored as the person's
        message (the held command released with it) and answered as a turn."""
        conv = await self._store.conversation(inbound.key)
        message_id = await self._store.add_message(
            conv.id,
            role=USER,
            author=inbound.sender_name or inbound.sender,
            text=ask,
            tokens=self._counter.count(ask),
            status="pending",
            created_at=inbound.received_at.timestamp(),
            platform_id=inbound.message_id,
            origin_id=conv.origin_id,
        )
        if command_id is not None:
            await self._store.release_command(command_id)
        await self._turn(replace(inbound, text=ask), message_id, conv)

    async def _turn(
        self,
        inbound: Inbound,
        message_id: int,
        conv: Conversation | None,
        *,
        recovered: bool = False,
    ) -> None:
        if conv is None:  # something ran for this person since intake (see _Job.conv)
            conv = await self._store.conversation(inbound.key)
        # Gateways sharing one store take a person's turns one at a time, and a message that
        # another gateway (or an earlier recovery) answered meanwhile is not answered again.
        async with self._store.turn_lock(conv.id):
            # The claim takes only a message still pending (one statement, no read before it).
            # another gateway's live claim is theirs; on a stepped clock every claim is
            stale = time.time() - CLAIM_STALE_SECONDS if self._trust.trusted() else 0.0
            if not await self._store.claim_question(message_id, stale_before=stale):
                log.debug("message %d in %s answered, gone or claimed by another gateway; "
                          "skipped", message_id, conv.id)  # fmt: skip
                return
            if recovered and self._too_old(inbound):
                await self._tell_unanswered(inbound, message_id)
                return
            await self._answer(inbound, message_id, conv)

    async def _answer(self, inbound: Inbound, message_id: int, conv: Conversation) -> None:
        """Answer the claimed question. ``conv`` was read before the turn lock: only a turn
        takes the lock, and a turn changes no conversation row, so waiting for another
        gateway's turn leaves it as read."""
        self.counters.add("turns")
        transport = self._transports[inbound.transport]
        busy = busy_now(transport)
        if busy is not None and busy.cause == "queue":
            log.warning("outbox of %s full; %s is told to try again", transport.name, inbound.key)
            await self._outbox.busy_notice(inbound, _busy(busy.seconds), question_id=message_id)
            return
        if busy is not None and message_id not in self._told:  # a hold (not told at intake)
            if busy.notice_now:
                await self._outbox.tell_held(inbound, busy)
            else:  # nothing may go on air now: told in the lane as soon as the radio may
                self._tell_early(inbound, message_id)
        limits = transport.limits
        stream: AnswerStream | None = await self._outbox.open_stream(inbound, message_id)
        try:
            with self._writes(inbound):
                async with transport.working(inbound):
                    await self._summarizer.settle(conv.id)  # a debt fold ending: its chapter
                    on_text = stream.update if stream is not None else None
                    ctx, completion = await self._fit.ask(
                        conv, inbound, message_id, limits, on_text=on_text,
                        speaker=_speaker(inbound, limits), system_prompt=self._persona(inbound),
                        before_call=lambda c: self._summarizer.before_reply(
                            conv.id, c.window_start_id),
                    )  # fmt: skip
        except LLMUnavailable as exc:
            log.warning("no answer for %s: %s", inbound.key, exc)
            if stream is not None:
                await stream.abort()
            notice = self._unavailable
            if isinstance(exc, ContextTooLong):
                notice = TOO_LONG.format(prefix=self._commands.prefix)
            entry = OutboxEntry(
                inbound.key, "notice", transport.fit(notice), question_id=message_id
            )
            row = await self._store.queue_claimed(entry, question_status="failed")
            self.counters.add("notices")
            await self._outbox.deliver_now(inbound, row)
            return
        except asyncio.CancelledError:
            if not self._was_stopped(inbound):
                raise  # a shutdown: the question stays pending for the next start
            if stream is not None:
                await stream.abort()
            await self._store.set_status(message_id, "failed")  # settled: never answered later
            return
        whole = completion.text.strip()
        text, rest = self._cut(transport, whole)
        trimmed = ctx.trimmed or len(inbound.text) > self._config.max_message_chars
        entry = OutboxEntry(
            inbound.key,
            "answer",
            text,
            reply_to=inbound.message_id,
            question_id=message_id,
            rest=rest,
        )
        try:
            row = await self._store.queue_claimed(
                entry,
                answer=StoredAnswer(
                    conv.id,
                    self._config.name,
                    whole,
                    self._counter.count(whole),
                    origin_id=conv.origin_id,
                    created_at=self._wall(),
                ),
            )
        except (sqlite3.Error, StorageError) as exc:  # disk full: the person hears why
            if await self._forgotten(message_id):  # !forget on another gateway meanwhile
                log.info("the conversation of %s was forgotten during its turn; the answer "
                         "is dropped", inbound.key)  # fmt: skip
                if stream is not None:
                    await stream.abort()
                return
            log.error("could not store the answer for %s: %s", inbound.key, exc)
            await self._notice(inbound, ANSWER_NOT_STORED)
            return
        # Before the delivery: a debt fold takes the slot this reply kept (bot.llm.gate).
        base = (
            FoldBase((*ctx.messages, ChatMessage("assistant", whole)), ctx.window[0].id)
            if (ctx.window and not inbound.images)
            else None
        )  # a fold continues this prompt: the server has it cached
        self._summarizer.maybe_schedule(conv, window_start_id=ctx.window_start_id, base=base)
        delivery = await self._outbox.deliver_now(
            inbound, row, note=TRIMMED_NOTE if trimmed else None, stream=stream
        )
        self.counters.add("answers")
        self.counters.replied(max(0.0, time.time() - inbound.received_at.timestamp()))
        log.info(
            "answered %s: %d context tokens (%s), %d answer chars, %s",
            inbound.key,
            ctx.tokens,
            " ".join(f"{b.name}={b.tokens}" for b in ctx.blocks),
            len(whole),
            delivery.status.value,
        )
        if self._indexer is not None:  # embeds this turn's messages in the background
            self._indexer.schedule(conv.id)

    async def _forgotten(self, message_id: int) -> bool:
        """True when the question is gone from the store (forgotten meanwhile): a turn then
        ends quietly, since the person asked for exactly that."""
        try:
            return not await self._store.messages_by_ids([message_id])
        except (sqlite3.Error, StorageError):
            return False  # the store is failing: the storage notice is the right one

    async def _incognito_turn(self, inbound: Inbound, *, bare: bool = False) -> None:
        """Answer without storing: stored memory plus this session's in-memory turns; ``bare``
        (a sender who may not use its memory, bot.trust): no memory and no turns at all."""
        transport = self._transports[inbound.transport]
        limits = transport.limits
        turns: Turns = deque()
        if bare:
            conv = Conversation(id=BLANK_ID, key=inbound.key, reset_after=0)
        else:
            conv = await self._store.conversation(inbound.key)
            stretch = await self._store.incognito_stretch(conv.id)  # ended elsewhere: new one
            turns = self._stretches.turns(inbound.key, conv.id, stretch)
        try:
            with self._writes(inbound):
                async with transport.working(inbound):
                    _ctx, completion = await self._fit.ask(
                        conv, inbound, None, limits, ephemeral=list(turns),
                        speaker=_speaker(inbound, limits), system_prompt=self._persona(inbound),
                    )  # fmt: skip
        except LLMUnavailable as exc:
            log.warning("no answer for %s: %s", inbound.key, exc)
            too_long = isinstance(exc, ContextTooLong)
            prefix = self._commands.prefix
            await self._notice(inbound, TOO_LONG.format(prefix=prefix) if too_long
                               else self._unavailable)  # fmt: skip
            return
        except asyncio.CancelledError:
            if not self._was_stopped(inbound):
                raise
            return  # nothing was stored for an incognito turn
        text = transport.fit(completion.text)
        turns.append(("person", inbound.text[: self._config.max_message_chars]))
        turns.append(("you", text))
        await self._outbox.send(Reply(inbound=inbound, text=text))


BLANK_ID = 0  # a conversation id no row has (ids start at 1): a memory with nothing in it


def _busy(seconds: float) -> str:
    return BUSY.format(minutes=max(1, math.ceil(seconds / 60)))
