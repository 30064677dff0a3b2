"""The turn pipeline: inbound message -> stored -> (command | context -> LLM) -> stored -> sent.

Invariants:
- The inbound message is persisted before anything else (status ``pending``), so a crash or a
  shutdown loses nothing; pending messages are picked up again at the next start.
- Per conversation, messages (commands included) are handled one at a time, in arrival order,
  by a worker task that exits when its queue is empty; different conversations run at once.
- LLM calls go through the gate's foreground lane (bounded; summaries yield to replies).
- A person over the queue limit or the rate limit gets one polite notice per limit window;
  their message is still stored (status ``limited``) and never answered by the LLM.
- The stored answer is exactly the text the transport delivers (``transport.fit``), recorded
  in the same transaction that marks the question answered; the delivery result follows.
- Notices (LLM unavailable, rate limited) are sent but never stored as something the model
  said. Commands and their replies are not part of the conversation log.
- Every background task is owned (``self._workers``) and ``drain`` waits for them with a
  timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from bot.commands import Commands
from bot.config import BotConfig
from bot.domain import ConversationKey, Delivery, DeliveryStatus, Inbound, Reply, ReplyKind
from bot.errors import LLMUnavailable
from bot.llm.port import LLM
from bot.llm.tokens import TokenCounter
from bot.memory.context import ContextBuilder
from bot.memory.indexer import Indexer
from bot.memory.port import MemoryStore
from bot.memory.store import ASSISTANT, USER
from bot.memory.summary import Summarizer
from bot.text import clean_inbound
from bot.transports.base import AnswerStream, Streams, Transport

log = logging.getLogger("bot.responder")

UNAVAILABLE = "LLM unavailable, try again later."
INTERNAL_ERROR = "Sorry, something went wrong on my side. Please try again."
EMPTY = "Your message was empty. Send some text, or {prefix}help for commands."
TRIMMED_NOTE = "your message was long; I read only its beginning"
NOT_STORED = "I could not save your message (storage problem), so I did not answer. Try later."
RECOVER_WITHIN_SECONDS = 15 * 60


@dataclass(frozen=True, slots=True)
class _Job:
    inbound: Inbound
    message_id: int | None  # None for commands (not stored)


class Responder:
    def __init__(
        self,
        *,
        store: MemoryStore,
        llm: LLM,
        context: ContextBuilder,
        summarizer: Summarizer,
        commands: Commands,
        counter: TokenCounter,
        config: BotConfig,
        indexer: Indexer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._llm = llm
        self._context = context
        self._summarizer = summarizer
        self._indexer = indexer
        self._commands = commands
        self._counter = counter
        self._config = config
        self._clock = clock
        self._transports: dict[str, Transport] = {}
        self._queues: dict[ConversationKey, deque[_Job]] = {}
        self._workers: dict[ConversationKey, asyncio.Task[None]] = {}
        self._recent: dict[tuple[str, str], deque[float]] = {}
        self._noticed: dict[tuple[str, str], float] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = True

    def attach(self, transport: Transport) -> None:
        self._transports[transport.name] = transport

    # --- intake -----------------------------------------------------------------------------
    async def handle(self, inbound: Inbound) -> None:
        """Called by transports. Returns once the message is stored and queued."""
        text = clean_inbound(inbound.text)
        inbound = replace(inbound, text=text)
        if not text:
            await self._notice(inbound, EMPTY.format(prefix=self._commands.prefix))
            return
        if self._commands.parse(text) is not None:
            if self._accepting:  # commands are not stored; during shutdown they are dropped
                self._enqueue(_Job(inbound, None))
            return
        limited = self._over_limit(inbound)
        try:
            conv = await self._store.conversation(inbound.key)
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
            )
        except sqlite3.Error as exc:  # disk full, database locked for too long, I/O error
            log.error("could not store a message from %s: %s", inbound.key, exc)
            await self._notice(inbound, NOT_STORED)
            return
        if limited:
            await self._notice_once(inbound, limited)
            return
        if not self._accepting:
            return  # stored as pending; answered after the restart
        self._enqueue(_Job(inbound, message_id))

    def _over_limit(self, inbound: Inbound) -> str | None:
        if self._commands.is_operator(inbound):
            return None
        who = (inbound.transport, inbound.sender)
        queued = sum(
            len(q) for key, q in self._queues.items() if (key.transport, key.person) == who
        )
        if queued >= self._config.queue_limit:
            return (
                f"You have {queued} messages waiting; I'll answer those first. "
                "Please wait for my reply."
            )
        rl = self._config.rate_limit
        now = self._clock()
        stamps = self._recent.setdefault(who, deque())
        while stamps and now - stamps[0] > rl.per_seconds:
            stamps.popleft()
        for stale in [k for k, v in self._recent.items() if not v and k != who]:
            del self._recent[stale]  # keep the table as small as the set of active people
        if len(stamps) >= rl.messages:
            wait = int(rl.per_seconds - (now - stamps[0])) + 1
            return (
                f"Slow down: at most {rl.messages} messages per {int(rl.per_seconds)} s. "
                f"Try again in {wait} s."
            )
        stamps.append(now)
        return None

    async def _notice_once(self, inbound: Inbound, text: str) -> None:
        who = (inbound.transport, inbound.sender)
        now = self._clock()
        if now - self._noticed.get(who, -1e18) < self._config.rate_limit.per_seconds:
            return  # one notice per window: a flood must not make us flood back
        self._noticed[who] = now
        await self._notice(inbound, text)

    def _enqueue(self, job: _Job) -> None:
        key = job.inbound.key
        self._queues.setdefault(key, deque()).append(job)
        if key not in self._workers:
            self._idle.clear()
            task = asyncio.create_task(self._work(key), name=f"turns {key}")
            self._workers[key] = task

    async def _work(self, key: ConversationKey) -> None:
        queue = self._queues[key]
        try:
            while queue:
                job = queue[0]
                try:
                    if job.message_id is None:
                        await self._command(job.inbound)
                    else:
                        await self._turn(job.inbound, job.message_id)
                except Exception:  # loop boundary: one bad turn must not stop this person's queue
                    log.exception("turn failed in %s", key)
                    await self._after_failure(job)
                finally:
                    queue.popleft()
        finally:
            self._queues.pop(key, None)
            self._workers.pop(key, None)
            if not self._workers:
                self._idle.set()

    # --- turns ------------------------------------------------------------------------------
    async def _command(self, inbound: Inbound) -> None:
        parsed = self._commands.parse(inbound.text)
        assert parsed is not None
        result = await self._commands.run(inbound, *parsed)
        transport = self._transports[inbound.transport]
        reply = Reply(
            inbound=inbound,
            text=transport.fit(result.text),
            kind=ReplyKind.COMMAND,
            attachments=result.attachments,
        )
        await transport.send(reply)

    async def _turn(self, inbound: Inbound, message_id: int) -> None:
        transport = self._transports[inbound.transport]
        limits = transport.limits
        conv = await self._store.conversation(inbound.key)
        stream: AnswerStream | None = (
            transport.stream(inbound) if isinstance(transport, Streams) else None
        )
        async with transport.working(inbound):
            ctx = await self._context.build(
                conv,
                new_text=inbound.text[: self._config.max_message_chars],
                new_message_id=message_id,
                budget=limits.context_tokens,
                style_hint=limits.style_hint,
            )
            messages = ctx.messages
            if inbound.images:  # for the model only, with the new message (never stored)
                messages = [*messages[:-1], replace(messages[-1], images=inbound.images)]
            try:
                completion = await self._llm.complete(
                    messages,
                    max_tokens=limits.max_tokens,
                    on_text=stream.update if stream is not None else None,
                )
            except LLMUnavailable as exc:
                log.warning("no answer for %s: %s", inbound.key, exc)
                if stream is not None:
                    await stream.abort()
                await self._store.set_status(message_id, "failed")
                await self._notice(inbound, UNAVAILABLE)
                return
        text = transport.fit(completion.text)
        trimmed = ctx.trimmed or len(inbound.text) > self._config.max_message_chars
        reply_id = await self._store.add_message(
            conv.id,
            role=ASSISTANT,
            author=self._config.name,
            text=text,
            tokens=self._counter.count(text),
            status="sending",
            parent_id=message_id,
            answers=message_id,
        )

        async def record_part(_index: int, platform_id: str) -> None:
            try:
                await self._store.add_part_id(reply_id, platform_id)
            except sqlite3.Error as exc:  # the answer still goes out
                log.warning("could not record a sent part of %s: %s", inbound.key, exc)

        reply = Reply(
            inbound=inbound,
            text=text,
            note=TRIMMED_NOTE if trimmed else None,
            progress=record_part,
        )
        delivery = await (stream.finish(reply) if stream is not None else self._send(reply))
        await self._store.set_status(
            reply_id,
            delivery.status.value,
            platform_id=delivery.message_ids[0] if delivery.message_ids else None,
        )
        log.info(
            "answered %s: %d context tokens (%s), %d answer chars, %s",
            inbound.key,
            ctx.tokens,
            " ".join(f"{b.name}={b.tokens}" for b in ctx.blocks),
            len(text),
            delivery.status.value,
        )
        self._summarizer.maybe_schedule(conv, window_start_id=ctx.window_start_id)
        if self._indexer is not None:  # embeds this turn's messages in the background
            self._indexer.schedule(conv.id)

    async def _send(self, reply: Reply) -> Delivery:
        transport = self._transports[reply.inbound.transport]
        try:
            return await transport.send(reply)
        except Exception as exc:  # transports report trouble in Delivery; this is a bug guard
            log.exception("transport %s raised from send", transport.name)
            return Delivery(DeliveryStatus.FAILED, detail=str(exc))

    async def _after_failure(self, job: _Job) -> None:
        """A turn that crashed: tell the person briefly and mark the message failed, so it is
        not retried (and crashing again) at every restart."""
        try:
            if job.message_id is not None:
                await self._store.set_status(job.message_id, "failed")
            await self._notice(job.inbound, INTERNAL_ERROR)
        except Exception:  # loop boundary: the store or transport may be what failed
            log.exception("could not report the failed turn in %s", job.inbound.key)

    async def _notice(self, inbound: Inbound, text: str) -> None:
        transport = self._transports[inbound.transport]
        await self._send(Reply(inbound=inbound, text=transport.fit(text), kind=ReplyKind.NOTICE))

    # --- lifecycle --------------------------------------------------------------------------
    async def recover_pending(self, *, within_seconds: float = RECOVER_WITHIN_SECONDS) -> int:
        """Queue stored-but-unanswered messages from a crash or shutdown (recent ones only)."""
        jobs = await self._store.pending_messages(
            since=time.time() - within_seconds, transports=tuple(self._transports)
        )
        for key, msg in jobs:
            inbound = Inbound(
                transport=key.transport,
                sender=key.person,
                space=key.space,
                text=msg.text,
                message_id=msg.platform_id,
                sender_name=msg.author,
            )
            self._enqueue(_Job(inbound, msg.id))
        if jobs:
            log.info("answering %d message(s) stored before the last shutdown", len(jobs))
        return len(jobs)

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def drain(self, *, timeout: float) -> None:
        """Stop taking new turns; finish the ones in flight (up to ``timeout``)."""
        self._accepting = False
        workers = list(self._workers.values())
        if workers:
            _done, pending = await asyncio.wait(workers, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d conversation(s) cut off at shutdown", len(pending))
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*pending, return_exceptions=True)
