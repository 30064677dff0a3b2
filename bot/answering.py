"""Answering a claimed question (``bot.responder``): the prompt within what the server holds,
the LLM call, the answer stored with its outbox row in one transaction and delivered; and the
incognito turn, answered without storing anything.

Invariants: those of ``bot.responder`` for a turn (one answer per stored question, claimed
under the person's turn lock; a failed LLM call ends in a stored notice that settles the
question; a question forgotten meanwhile ends quietly). ``Answerer`` owns the answers being
written now (``stop_answers``); the queue (``bot.turn_queue``) runs it, one job at a time per
conversation. The model and the persona chosen for the conversation (``bot.chat_settings``)
are read per turn and passed to the LLM call as arguments.
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
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from urllib.parse import urlsplit

from bot.chat_settings import ChatSettings
from bot.config import BotConfig
from bot.delivery import OutboxSender, busy_now
from bot.domain import Inbound, Reply, TransportLimits
from bot.errors import LLMUnavailable, StorageError
from bot.fitting import TOO_LONG, FittingAsk
from bot.llm.port import ChatMessage, ContextTooLong
from bot.llm.tokens import TokenCounter
from bot.memory.indexer import Indexer
from bot.memory.keep import CLAIM_STALE_SECONDS
from bot.memory.port import MemoryStore
from bot.memory.records import (
    Conversation,
    OutboxEntry,
    StoredAnswer,
)
from bot.memory.store import USER
from bot.memory.stretch import HeldStretches, Turns
from bot.memory.summary import FoldBase, Summarizer
from bot.notice_lanes import Notices, busy_text
from bot.ops.metrics import Counters
from bot.restarts import Lateness
from bot.text import MESH_COMMAND_BYTES, fit_bytes
from bot.transports.base import AnswerStream, Paginates, Rereads, Transport
from bot.turn_queue import QueueKey, queue_key
from bot.urls import redact

log = logging.getLogger("bot.answering")

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


def cut(transport: Transport, text: str) -> tuple[str, str | None]:
    """What goes out now, and the rest for ``!more`` (transports that paginate)."""
    if isinstance(transport, Paginates):
        return transport.fit_more(text)
    return transport.fit(text), None


class Answerer:
    """Answers claimed questions and incognito turns (see the module docstring)."""

    def __init__(
        self,
        *,
        store: MemoryStore,
        transports: Mapping[str, Transport],
        outbox: OutboxSender,
        fit: FittingAsk,
        summarizer: Summarizer,
        counter: TokenCounter,
        config: BotConfig,
        counters: Counters,
        notices: Notices,
        lateness: Lateness,
        stretches: HeldStretches,
        prefix: str,
        settings: ChatSettings | None = None,
        indexer: Indexer | None = None,
        wall: Callable[[], float] = time.time,
        unavailable: str = UNAVAILABLE,
    ) -> None:
        self._store = store
        self._transports = transports
        self._outbox = outbox
        self._fit = fit  # every LLM call: a prompt within what the server holds
        self._summarizer = summarizer
        self._counter = counter
        self._config = config
        self._counters = counters
        self._notices = notices
        self._lateness = lateness
        self._stretches = stretches
        self._prefix = prefix
        self._settings = settings  # model and persona per channel, server, bot or person
        self._indexer = indexer
        self._wall = wall  # dates of answers (bench: replayed dates)
        self._unavailable = unavailable  # the notice when no endpoint answered (app: its URL)
        self._writing: dict[QueueKey, asyncio.Task[object]] = {}  # answers being written now
        self._stop_asked: set[QueueKey] = set()  # ... and asked to stop (``stop_answers``)

    def _persona(self, inbound: Inbound) -> str | None:
        """The persona's prompt chosen for this conversation (None: ``bot.system_prompt``)."""
        return None if self._settings is None else self._settings.persona(inbound)[1]

    def _model(self, inbound: Inbound) -> str | None:
        """The model chosen for this conversation (None: the configured one)."""
        return None if self._settings is None else self._settings.model(inbound)

    def stop_answers(self, transport: str) -> int:
        """Stop the answers being written now for people on ``transport`` (the console's
        Ctrl-C). Returns how many were asked to stop (0: nothing was being written)."""
        n = 0
        for qkey, task in self._writing.items():
            if qkey[0] == transport and qkey not in self._stop_asked:
                self._stop_asked.add(qkey)
                task.cancel()
                n += 1
        return n

    @contextlib.contextmanager
    def _writes(self, inbound: Inbound) -> Iterator[None]:
        """While the answer is being written: ``stop_answers`` may cancel it."""
        qkey = queue_key(inbound)
        task = asyncio.current_task()
        if task is not None:
            self._writing[qkey] = task
        try:
            yield
        finally:
            self._writing.pop(qkey, None)

    def _was_stopped(self, inbound: Inbound) -> bool:
        """True (and the cancel taken back) when ``stop_answers`` cancelled this turn."""
        key = inbound.key
        qkey = queue_key(inbound)
        if qkey not in self._stop_asked:
            return False
        self._stop_asked.discard(qkey)
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        log.info("the answer for %s was stopped by the person", key)
        return True

    async def failed(
        self, inbound: Inbound, *, message_id: int | None = None, command_id: int | None = None
    ) -> None:
        """A turn that crashed: tell the person briefly (first: the store may be what failed)
        and mark the message failed, so it is not retried (and crashing again) at every
        restart."""
        if command_id is not None:  # told below: never run (and crash) again
            with contextlib.suppress(Exception):  # loop boundary: the store may have failed
                await self._store.release_command(command_id)
        try:
            await self._notices.notice(inbound, INTERNAL_ERROR)
        except Exception:  # loop boundary: the transport may be what failed
            log.exception("could not tell %s about the failed turn", inbound.key)
        try:
            if message_id is not None:
                await self._store.set_status(message_id, "failed")
        except Exception:  # loop boundary: the store may be what failed (disk full)
            log.exception("could not mark the failed turn in %s", inbound.key)

    async def go_on(self, inbound: Inbound, ask: str, command_id: int | None) -> None:
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
        await self.turn(replace(inbound, text=ask), message_id, conv)

    async def turn(
        self,
        inbound: Inbound,
        message_id: int,
        conv: Conversation | None,
        *,
        recovered: bool = False,
    ) -> None:
        """Answer the stored question ``message_id`` (``recovered``: stored before a restart or
        by a gateway that died; its transport may reread it, for its images)."""
        try:
            await self._turn(inbound, message_id, conv, recovered=recovered)
        finally:
            self._notices.forget_told(message_id)

    async def _turn(
        self, inbound: Inbound, message_id: int, conv: Conversation | None, *, recovered: bool
    ) -> None:
        transport = self._transports.get(inbound.transport)
        if recovered and isinstance(transport, Rereads):
            inbound = await transport.reread(inbound)  # images, not stored
        if conv is None:  # something ran for this person since intake (see TurnJob.conv)
            conv = await self._store.conversation(inbound.key)
        # Gateways sharing one store take a person's turns one at a time, and a message that
        # another gateway (or an earlier recovery) answered meanwhile is not answered again.
        async with self._store.turn_lock(conv.id):
            # The claim takes only a message still pending (one statement, no read before it).
            # another gateway's live claim is theirs; on a stepped clock every claim is
            stale = time.time() - CLAIM_STALE_SECONDS if self._outbox.trust.trusted() else 0.0
            if not await self._store.claim_question(message_id, stale_before=stale):
                log.debug("message %d in %s answered, gone or claimed by another gateway; "
                          "skipped", message_id, conv.id)  # fmt: skip
                return
            if recovered and self._lateness.too_old(inbound):
                await self._lateness.tell_unanswered(inbound, message_id)
                return
            await self._answer(inbound, message_id, conv)

    async def _answer(self, inbound: Inbound, message_id: int, conv: Conversation) -> None:
        """Answer the claimed question. ``conv`` was read before the turn lock: only a turn
        takes the lock, and a turn changes no conversation row, so waiting for another
        gateway's turn leaves it as read."""
        self._counters.add("turns")
        transport = self._transports[inbound.transport]
        busy = busy_now(transport)
        if busy is not None and busy.cause == "queue":
            log.warning("outbox of %s full; %s is told to try again", transport.name, inbound.key)
            await self._outbox.busy_notice(inbound, busy_text(busy.seconds), question_id=message_id)
            return
        told = self._notices.was_told(message_id)  # at intake, in the lane
        if busy is not None and not told:  # a hold
            if busy.notice_now:
                await self._outbox.tell_held(inbound, busy)
            else:  # nothing may go on air now: told in the lane as soon as the radio may
                self._notices.tell_early(inbound, message_id)
        limits = transport.limits
        model = self._model(inbound)  # every LLM call of this turn, and the fold continuing it
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
                        model=model,
                    )  # fmt: skip
        except LLMUnavailable as exc:
            log.warning("no answer for %s: %s", inbound.key, exc)
            if stream is not None:
                await stream.abort()
            notice = self._unavailable
            if isinstance(exc, ContextTooLong):
                notice = TOO_LONG.format(prefix=self._prefix)
            entry = OutboxEntry(
                inbound.key, "notice", transport.fit(notice), question_id=message_id
            )
            row = await self._store.queue_claimed(entry, question_status="failed")
            self._counters.add("notices")
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
        text, rest = cut(transport, whole)
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
            await self._notices.notice(inbound, ANSWER_NOT_STORED)
            return
        # Before the delivery: a debt fold takes the slot this reply kept (bot.llm.gate).
        base = (
            FoldBase((*ctx.messages, ChatMessage("assistant", whole)), ctx.window[0].id, model)
            if (ctx.window and not inbound.images)
            else None
        )  # a fold continues this prompt: the server has it cached
        self._summarizer.maybe_schedule(conv, window_start_id=ctx.window_start_id, base=base)
        delivery = await self._outbox.deliver_now(
            inbound, row, note=TRIMMED_NOTE if trimmed else None, stream=stream
        )
        self._counters.add("answers")
        self._counters.replied(max(0.0, time.time() - inbound.received_at.timestamp()))
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

    async def incognito_turn(self, inbound: Inbound, *, bare: bool = False) -> None:
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
                        model=self._model(inbound),
                    )  # fmt: skip
        except LLMUnavailable as exc:
            log.warning("no answer for %s: %s", inbound.key, exc)
            too_long = isinstance(exc, ContextTooLong)
            prefix = self._prefix
            await self._notices.notice(inbound, TOO_LONG.format(prefix=prefix) if too_long
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
