"""Background indexing of message vectors (memory.embeddings): after each turn, and catching up.

Invariants:
- Never delays a reply: ``schedule`` only records a conversation id and wakes the one worker
  task; embedding happens in that task, one request at a time (a Pi's server is shared with
  generation). The periodic catch-up (``backfill``) pauses between batches while a turn is
  running (``idle``) and whenever a conversation was scheduled, which goes first.
- Owned task: the worker lives in ``self._tasks`` and ends through ``self._stopping`` within
  ``stop``'s timeout (then it is cancelled). Pending work is bounded (``MAX_PENDING``
  conversations); what does not fit is found by the next catch-up.
- An outage of the embedding server is logged at WARNING once, then retried with exponential
  backoff and jitter; when the server answers again a full catch-up embeds what was missed.
  Message text is never logged.
- Only messages after a conversation's reset mark are embedded (the store's
  ``messages_missing_vectors``), oldest first, each cut to ``MAX_EMBED_CHARS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

from bot.errors import EmbeddingUnavailable
from bot.memory.embeddings import Embedder
from bot.memory.port_recall import Recall
from bot.memory.store import StoredMessage

log = logging.getLogger("bot.memory.indexer")

BACKFILL_SECONDS = 600.0  # periodic catch-up (messages stored while the server was away, ...)
STARTUP_DELAY = 5.0  # the first catch-up waits for the transports to settle
RETRY_INITIAL = 5.0
RETRY_MAX = 300.0
IDLE_POLL = 1.0  # while a turn runs, a catch-up checks this often whether it may go on
MAX_PENDING = 1024
MAX_EMBED_CHARS = 2000  # embedding models read a few hundred tokens; Ollama truncates the rest
_RNG = random.Random()


def retry_delay(
    failures: int, *, initial: float, maximum: float, rng: random.Random | None = None
) -> float:
    """Exponential backoff with jitter: about initial, 2x, 4x, ... capped at maximum; the
    jitter (x0.5-1.0) keeps bots that lost the same server from retrying in lockstep."""
    base = min(maximum, initial * (1 << min(max(failures - 1, 0), 32)))
    return base * (rng or _RNG).uniform(0.5, 1.0)


def document_text(message: StoredMessage) -> str:
    """What is embedded for a message (the retrieval query is embedded as the person wrote it)."""
    text = message.text[:MAX_EMBED_CHARS].strip() or "(empty message)"
    return f"{message.author}: {text}"  # who said it: questions often name the person


class Indexer:
    def __init__(
        self,
        *,
        store: Recall,
        embedder: Embedder,
        batch: int,
        idle: Callable[[], bool] = lambda: True,
        backfill_seconds: float = BACKFILL_SECONDS,
        startup_delay: float = STARTUP_DELAY,
        retry_initial: float = RETRY_INITIAL,
        retry_max: float = RETRY_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._batch = batch
        self._idle = idle
        self._backfill_seconds = backfill_seconds
        self._startup_delay = startup_delay
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._clock = clock
        self._pending: dict[int, None] = {}  # conversation ids, in scheduling order
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures = 0  # consecutive; > 0 means the server is considered down
        self.embedded = 0  # vectors stored since start (for tests and `memory reindex`)

    @property
    def model(self) -> str:
        return self._embedder.model

    @property
    def available(self) -> bool:
        """False from a failed request until one succeeds again."""
        return self._failures == 0

    @property
    def running(self) -> bool:
        return any(not t.done() for t in self._tasks)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._tasks or self._stopping.is_set():
            return
        task = asyncio.create_task(self._run(), name="embedding indexer")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, *, timeout: float = 5.0) -> None:
        """Stop after the request in flight (at most ``timeout`` seconds, then cancel)."""
        self._stopping.set()
        self._wake.set()
        tasks = list(self._tasks)
        if not tasks:
            return
        _done, late = await asyncio.wait(tasks, timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*late, return_exceptions=True)

    def schedule(self, conversation_id: int) -> bool:
        """Embed this conversation's new messages soon, in the background. Never blocks."""
        if self._stopping.is_set():
            return False
        if conversation_id not in self._pending and len(self._pending) >= MAX_PENDING:
            return False  # the periodic catch-up will find them
        self._pending[conversation_id] = None
        self._wake.set()
        return True

    # --- work ------------------------------------------------------------------------------
    async def index_conversation(self, conversation_id: int) -> int:
        """Embed every message of one conversation that has no vector. Raises
        ``EmbeddingUnavailable``."""
        done = 0
        cursor = 0
        while not self._stopping.is_set():
            batch = await self._store.messages_missing_vectors(
                self.model, limit=self._batch, conversation_id=conversation_id, after_id=cursor
            )
            if not batch:
                break
            done += await self._embed(batch)
            cursor = batch[-1].id
        return done

    async def backfill(
        self,
        *,
        progress: Callable[[int], None] | None = None,
        polite: bool = False,
    ) -> int:
        """Embed every message (all conversations) that has no vector, oldest first; returns
        how many were stored. ``polite`` (the background catch-up) waits while a turn runs
        and returns early when a conversation is scheduled. Raises ``EmbeddingUnavailable``."""
        done = 0
        cursor = 0
        while not self._stopping.is_set():
            if polite:
                while not self._idle() and not self._stopping.is_set():
                    await self._pause(IDLE_POLL)
                if self._pending:
                    break
            batch = await self._store.messages_missing_vectors(
                self.model, limit=self._batch, after_id=cursor
            )
            if not batch:
                break
            done += await self._embed(batch)
            cursor = batch[-1].id
            if progress is not None:
                progress(done)
        return done

    async def _embed(self, batch: list[StoredMessage]) -> int:
        vectors = await self._embedder.embed([document_text(m) for m in batch])
        if len(vectors) != len(batch):
            raise EmbeddingUnavailable(
                f"the embedder returned {len(vectors)} vectors for {len(batch)} messages. "
                "Fix: check the embedding server (memory.embeddings)."
            )
        stored = await self._store.add_vectors(
            [(m.id, m.conversation_id, self.model, v) for m, v in zip(batch, vectors, strict=True)]
        )
        self.embedded += stored
        return stored

    async def _run(self) -> None:
        next_backfill = self._clock() + self._startup_delay
        retry_at = 0.0
        while not self._stopping.is_set():
            now = self._clock()
            if self._failures:
                due = retry_at  # an outage: wait for the retry, whatever is scheduled
            elif self._pending:
                due = now
            else:
                due = next_backfill
            if due > now:
                await self._pause(due - now, wake=not self._failures)
                continue
            self._wake.clear()
            try:
                if self._pending:  # the turns just answered go first
                    cid = next(iter(self._pending))
                    await self.index_conversation(cid)
                    self._pending.pop(cid, None)
                else:  # the periodic catch-up (or the retry after an outage)
                    await self.backfill(polite=True)
                    if not self._pending:
                        next_backfill = self._clock() + self._backfill_seconds
                if self._failures:
                    next_backfill = self._clock()  # back from an outage: catch up at once
                self._back_up()
            except EmbeddingUnavailable as exc:
                retry_at = self._clock() + self._down(str(exc))
            except Exception:  # loop boundary: indexing must never take the bot down
                log.exception("embedding indexer failed; retrying later")
                retry_at = self._clock() + self._down(None)

    def _down(self, reason: str | None) -> float:
        self._failures += 1
        if self._failures == 1 and reason is not None:
            log.warning(
                "embedding server unavailable; retrieval uses words only until it is back, "
                "then missed messages are embedded: %s",
                reason,
            )
        return retry_delay(self._failures, initial=self._retry_initial, maximum=self._retry_max)

    def _back_up(self) -> None:
        if self._failures:
            log.info("embedding server is back; missed messages are embedded")
        self._failures = 0

    async def _pause(self, seconds: float, *, wake: bool = False) -> None:
        """Sleep ``seconds``; end early on stop (and, with ``wake``, on a new schedule)."""
        waiters = [asyncio.ensure_future(self._stopping.wait())]
        if wake:
            waiters.append(asyncio.ensure_future(self._wake.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
