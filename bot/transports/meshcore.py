"""MeshCore transport: the bot on a MeshCore mesh, through one companion radio.

Three modules, composed here: ``meshcore_link`` (the ``meshcore`` library behind ``Companion``),
``meshcore_outbox`` (fair, paced parts; DM ACKs and re-sends) and this one (the link's life,
receiving, the Transport protocol). The rules are pure and live in ``meshcore_rules`` (who is
answered, the limits, airtime) and the shared ``mesh_text``/``mesh_rules``/``mesh_airtime``.
Only ``meshcore*.py`` modules import ``meshcore``.

Invariants:
- The link lives forever: connect, serve, and after any loss (the library's disconnect, a
  command that got no answer, the probe) close and reconnect after ``mesh_rules.Backoff``
  (``reconnect_initial`` doubling to ``reconnect_max``, with jitter), until ``stop``.
- The probe: every ``probe_every`` seconds the companion is asked for its radio counters
  (``get_stats_radio``, else the time). No answer within ``probe_timeout``: the firmware is
  taken for hung; the operator is told (a WARNING naming the fix, ``health().detail``, the
  ``hung`` count) and the link is re-opened. The counters also feed the pacer the channel's
  airtime (received + sent seconds per minute).
- Receiving: every ``MESSAGES_WAITING`` push (and every (re)connect) drains the companion's
  queue (``SYNC_NEXT_MESSAGE`` until none is left). A DM is answered by DM; a channel text only
  on an enabled slot with the trigger (``meshcore_rules``). A copy seen before (same sender,
  sender timestamp and text) is dropped. Message text is never logged above DEBUG.
- Identity: a DM resolved to one contact's full public key is ``authenticated`` and its sender
  is that key (``meshcore_rules``); operators are ``meshcore:<key or 6+ byte prefix>``
  (``bot.trust``). Channel texts are never authenticated.
- Contacts: a DM can only come from a contact the companion holds (it needs the key to
  decrypt), so answering needs no contact work. A node the companion heard but did not add
  (``manual_add_contacts`` on) is added when ``auto_add_contacts`` is on, so that it can DM
  the bot; a full contact table is reported to the operator.
- ``fit`` is pure: parts of at most ``chunk_bytes`` (``meshcore_rules.chunk_bytes``: the DM
  limit and the channel limit once the firmware prepended the node's name), at most
  ``max_parts`` of them, cut with `` … (!more)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from bot.config_meshcore import MeshCoreConfig
from bot.domain import DM_SPACE, Delivery, DeliveryStatus, Inbound, Reply, TransportLimits
from bot.errors import TransportError
from bot.transports.base import OnMessage, TransportHealth
from bot.transports.mesh_airtime import CHANNEL_WINDOW, Metrics
from bot.transports.mesh_rules import Backoff, Clock, Cooldown, Dedup, SystemClock
from bot.transports.mesh_text import MARKER, fit_more, render_parts, split_parts, utf8_len
from bot.transports.mesh_view import MeshView, NodeBook
from bot.transports.meshcore_link import Companion, CompanionTimeout, open_companion
from bot.transports.meshcore_outbox import Job, MeshCoreOutbox, Part
from bot.transports.meshcore_rules import (
    Accepted,
    Dropped,
    Rules,
    chunk_bytes,
    classify_channel,
    classify_dm,
    contact_nodes,
    space_channel,
)

log = logging.getLogger("bot.transport.meshcore")

INBOUND_LIMIT = 64
QUIET = ("no trigger", "not enabled")  # everyday channel chatter: DEBUG only
Opener = Callable[[MeshCoreConfig], Awaitable[Companion]]

__all__ = ["MeshCoreTransport", "build_meshcore", "running"]


class MeshCoreTransport:
    """See the module docstring. Build it with ``build_meshcore``."""

    name = "meshcore"

    def __init__(
        self,
        *,
        config: MeshCoreConfig,
        bot_name: str,
        command_prefix: str,
        opener: Opener,
        clock: Clock,
        rng: random.Random | None = None,
        command_names: tuple[str, ...] = (),
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._cfg = config
        self._opener = opener
        self._clock = clock
        self._wall = wall
        self._marker = f"{MARKER} ({command_prefix}more)"
        self._rules = Rules(
            channels=frozenset(config.channels),
            mention=config.trigger or f"@{bot_name}",
            command_prefix=command_prefix if config.prefix_trigger else None,
            commands=frozenset(command_names) if command_names else frozenset({"help"}),
            ignore_names=frozenset(n.casefold() for n in config.ignore_names),
            ignore_keys=config.ignore_keys,
        )
        capacity = chunk_bytes(None, cap=config.chunk_bytes) * config.max_parts
        self.limits = TransportLimits(
            context_tokens=config.context_tokens,
            max_tokens=config.max_tokens,
            style_hint=(
                "You are answering over MeshCore LoRa radio: reply in plain text, no markdown "
                f"or lists, ideally under 120 bytes (about 20 words) and never more than "
                f"{capacity} bytes."
            ),
        )
        self._backoff = Backoff(
            initial=config.reconnect_initial, maximum=config.reconnect_max, rng=rng
        )
        self._dedup = Dedup(window=config.dedup_seconds)
        self._channel_cooldown = Cooldown(seconds=config.channel_cooldown)
        self._companion: Companion | None = None
        self._name: str | None = None  # the companion's node name (the channel prefix)
        self._on_message: OnMessage | None = None
        self._inbound: asyncio.Queue[Inbound] = asyncio.Queue(maxsize=INBOUND_LIMIT)
        self._waiting = asyncio.Event()
        self._lost = asyncio.Event()
        self._lost_reason = ""
        self._connecting = False
        self._stopping = False
        self._closed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._broken = ""
        self._started = False
        self._nodes = NodeBook()
        self._stats: tuple[float, float] | None = None  # (at, rx + tx air seconds)
        self.outbox = MeshCoreOutbox(
            config=config,
            clock=clock,
            link=lambda: None if self._lost.is_set() else self._companion,
            lost=self._link_lost,
            own_name=lambda: self._name,
            readd=self._readd,
            wall=wall,
        )
        self.hung = 0  # probes that got no answer (the companion re-opened each time)
        self.reconnects = 0
        self.device: dict[str, Any] = {}  # firmware, model (DEVICE_QUERY), for doctor/status
        self.contacts_full = False

    # --- Transport protocol ----------------------------------------------------------------
    @property
    def chunk_bytes(self) -> int:
        return chunk_bytes(self._name, cap=self._cfg.chunk_bytes)

    def command_room(self) -> int:
        """A command's reply fits one packet (airtime; ``SmallCommands``)."""
        return self.chunk_bytes

    def fit(self, text: str) -> str:
        return self.fit_more(text)[0]

    def fit_more(self, text: str) -> tuple[str, str | None]:
        return fit_more(
            text, chunk_bytes=self.chunk_bytes, max_parts=self._cfg.max_parts, marker=self._marker
        )

    def working(self, inbound: Inbound) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def start(self, on_message: OnMessage) -> None:
        if self._started:
            raise TransportError("the meshcore transport was already started")
        self._started = True
        self._on_message = on_message
        for coro in (self._link_loop(), self._inbound_loop(), self.outbox.run()):
            self._spawn(coro)

    async def send(self, reply: Reply) -> Delivery:
        if not self._started or self._stopping:
            return Delivery(DeliveryStatus.PENDING, detail="the meshcore transport is not running")
        try:
            job = self._job(reply)
        except ValueError as exc:
            return Delivery(DeliveryStatus.FAILED, detail=str(exc))
        if not job.parts:
            return Delivery(DeliveryStatus.FAILED, detail="nothing to send (empty reply)")
        if len(self.outbox.jobs) >= self._cfg.outbox_limit * 4:
            return Delivery(DeliveryStatus.PENDING, detail="outbox full")
        self._nodes.reply_to(_book_id(reply.inbound.sender))
        self.outbox.add(job)
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            self.outbox.drop(job)
            raise

    def busy_for(self) -> float | None:
        waiting = len(self.outbox.jobs)
        if waiting < self._cfg.outbox_limit:
            return None
        return waiting * self._cfg.spacing_seconds * self._cfg.max_parts

    async def stop(self) -> None:
        if self._stopping:
            await self._closed.wait()
            return
        self._stopping = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._inbound.join(), 5.0)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.outbox.stop()
        companion, self._companion = self._companion, None
        if companion is not None:
            await companion.close()
        self._closed.set()
        log.info("meshcore transport stopped")

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- sending ------------------------------------------------------------------------------
    def _job(self, reply: Reply) -> Job:
        inbound = reply.inbound
        texts = render_parts(
            split_parts(
                self.fit(reply.text), chunk_bytes=self.chunk_bytes, max_parts=self._cfg.max_parts
            )
        )
        if inbound.space == DM_SPACE:
            key = inbound.sender if len(inbound.sender) == 64 else None
            prefix, channel = inbound.sender[:12], None
            if len(prefix) != 12 or not all(c in "0123456789abcdef" for c in prefix):
                raise ValueError(f"not a MeshCore key: {inbound.sender[:16]!r}")
        else:
            index = space_channel(inbound.space)
            if index is None:
                raise ValueError(f"unknown MeshCore space {inbound.space!r}")
            key, prefix, channel = None, None, index
        done = reply.done_parts
        return Job(
            reply=reply,
            person=inbound.sender,
            prefix=prefix,
            key=key,
            channel=channel,
            parts=[Part(i, t, state="done" if i in done else "todo") for i, t in enumerate(texts)],
            future=asyncio.get_running_loop().create_future(),
            enqueued_at=self._clock.monotonic(),
            urgent=reply.kind.value == "notice" and len(texts) == 1,
        )

    async def _readd(self, job: Job) -> bool:
        companion = self._companion
        if companion is None or job.key is None:
            return False
        contact = companion.contacts().get(job.key)
        if contact is None:
            return False
        try:
            await companion.add_contact(contact)
        except TransportError as exc:
            log.warning("could not add %s again as a contact: %s", job.person, exc)
            return False
        log.info("added %s again as a contact (the companion had dropped it)", job.person)
        return True

    # --- the link -------------------------------------------------------------------------------
    def _link_lost(self, reason: str) -> None:
        if self._companion is not None and not self._lost.is_set():
            self._lost_reason = reason
            self._lost.set()

    async def _link_loop(self) -> None:
        while not self._stopping:
            self._connecting = True
            try:
                companion = await self._opener(self._cfg)
            except TransportError as exc:
                self._connecting = False
                self._lost_reason = str(exc)
                delay = self._backoff.next()
                log.warning("meshcore: %s; trying again in %.0f s", exc, delay)
                await self._clock.sleep(delay)
                continue
            self._connecting = False
            await self._serve(companion)
            if self._stopping:
                return
            self.reconnects += 1
            delay = self._backoff.next()
            log.warning("meshcore link lost (%s); reconnecting in %.0f s", self._lost_reason, delay)
            await self._clock.sleep(delay)

    async def _serve(self, companion: Companion) -> None:
        self._lost.clear()
        companion.on_waiting = self._waiting.set
        companion.on_ack = self.outbox.ack
        companion.on_lost = self._link_lost
        companion.on_advert = self._advert
        companion.on_full = self._full
        info = companion.info
        self._name = info.name or None
        self.outbox.radio = (info.sf, info.bw_khz, info.cr)
        self._companion = companion
        try:
            await self._setup(companion)
        except CompanionTimeout as exc:
            self._link_lost(str(exc))
        if not self._lost.is_set():
            self._backoff.reset()
            log.info(
                "meshcore up on %s: node %r, key %s..., %d contacts", self._cfg.where(),
                info.name, info.public_key[:12], len(companion.contacts()),
            )  # fmt: skip
            self.outbox.wake()
            self._waiting.set()  # messages that arrived while we were away
        tasks = [asyncio.ensure_future(self._lost.wait()), asyncio.ensure_future(self._fetch())]
        if self._cfg.probe_every > 0:
            tasks.append(asyncio.ensure_future(self._probe()))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    log.error("a meshcore loop failed", exc_info=t.exception())
                    self._lost_reason = f"internal error: {t.exception()}"
            self._companion = None
            await companion.close()

    async def _setup(self, companion: Companion) -> None:
        with contextlib.suppress(TransportError):
            self.device = await companion.device_info()
        await companion.refresh_contacts()
        if companion.info.manual_add_contacts and not self._cfg.auto_add_contacts:
            log.warning(
                "meshcore: the companion adds contacts by hand only and auto_add_contacts is "
                "off: a node must be added in the app before it can DM the bot"
            )

    async def _fetch(self) -> None:
        while True:
            await self._waiting.wait()
            self._waiting.clear()
            companion = self._companion
            if companion is None:
                return
            while True:
                try:
                    got = await companion.next_message()
                except CompanionTimeout as exc:
                    self._link_lost(str(exc))
                    return
                except TransportError as exc:
                    log.warning("meshcore: fetching a message failed: %s", exc)
                    break
                if got is None:
                    break
                kind, payload = got
                await self._received(companion, kind, payload)

    async def _probe(self) -> None:
        while True:
            await self._clock.sleep(self._cfg.probe_every)
            companion = self._companion
            if companion is None:
                return
            try:
                stats = await asyncio.wait_for(companion.radio_stats(), self._cfg.probe_timeout)
                if stats is None:
                    await asyncio.wait_for(companion.device_time(), self._cfg.probe_timeout)
                else:
                    self._note_stats(stats)
            except (TimeoutError, CompanionTimeout):
                self.hung += 1
                log.warning(
                    "meshcore: the companion at %s did not answer a probe within %.0f s "
                    "(hung firmware?); re-opening the link. Fix if it repeats: power-cycle "
                    "the radio, update its firmware", self._cfg.where(), self._cfg.probe_timeout,
                )  # fmt: skip
                self._link_lost("the companion stopped answering (probe)")
                return

    def _note_stats(self, stats: dict[str, Any]) -> None:
        now = self._clock.monotonic()
        air = float(stats.get("rx_air_secs", 0)) + float(stats.get("tx_air_secs", 0))
        if self._stats is not None:
            at, before = self._stats
            span = now - at
            if span >= CHANNEL_WINDOW / 2 and air >= before:
                util = min(100.0, 100.0 * (air - before) / span)
                self.outbox.pacer.note_metrics(Metrics(channel_utilization=util), now)
        self._stats = (now, air)

    def _advert(self, contact: dict[str, Any]) -> None:
        key = contact.get("public_key")
        if not isinstance(key, str):
            return
        self._nodes.heard(key[:12], snr=None, rssi=None, at=self._wall())
        if self._cfg.auto_add_contacts and self._companion is not None:
            self._spawn(self._add(self._companion, contact))

    async def _add(self, companion: Companion, contact: dict[str, Any]) -> None:
        try:
            await companion.add_contact(contact)
            log.info(
                "meshcore: added contact %s... (it can DM the bot now)", contact["public_key"][:12]
            )
        except TransportError as exc:
            log.warning("meshcore: could not add a contact: %s", exc)

    def _full(self) -> None:
        if not self.contacts_full:
            log.warning(
                "meshcore: the companion's contact table is full: new nodes cannot DM the bot. "
                "Fix: remove old contacts (app or meshcore-cli), or turn on overwriting the "
                "oldest contact in the companion's settings"
            )
        self.contacts_full = True

    # --- receiving ------------------------------------------------------------------------------
    async def _received(self, companion: Companion, kind: str, payload: dict[str, Any]) -> None:
        if kind == "dm":
            verdict = classify_dm(
                payload, rules=self._rules, resolve=lambda p: _resolve(companion, p)
            )
            if isinstance(verdict, Accepted) and not verdict.authenticated:
                with contextlib.suppress(TransportError):  # a contact added since: look again
                    await companion.refresh_contacts()
                verdict = classify_dm(
                    payload, rules=self._rules, resolve=lambda p: _resolve(companion, p)
                )
        elif kind == "channel":
            verdict = classify_channel(payload, rules=self._rules, own_name=self._name)
        else:
            return
        if isinstance(verdict, Dropped):
            quiet = any(verdict.reason.endswith(q) for q in QUIET)
            (log.debug if quiet else log.info)("ignored a %s: %s", kind, verdict.reason)
            return
        self._accept(verdict)

    def _accept(self, msg: Accepted) -> None:
        now = self._clock.monotonic()
        if self._dedup.is_duplicate(
            sender=hash(msg.sender), packet_id=hash(msg.message_id), now=now
        ):
            log.info("dropped a copy of a message from %s", msg.sender[:16])
            return
        if not msg.is_dm:
            key = f"{msg.sender}@{msg.space}"
            if now < self._channel_cooldown.ready_at(key):
                log.info("channel cooldown: ignoring another trigger from %s", msg.sender)
                return
            self._channel_cooldown.note(key, now)
        self._nodes.heard(msg.prefix or msg.sender, snr=None, rssi=None, at=self._wall())
        self._nodes.message_from(msg.prefix or msg.sender)
        inbound = Inbound(
            transport=self.name,
            sender=msg.sender,
            text=msg.text,
            space=msg.space,
            message_id=msg.message_id,
            sender_name=msg.name,
            authenticated=msg.authenticated,
        )
        try:
            self._inbound.put_nowait(inbound)
        except asyncio.QueueFull:
            log.warning("inbound queue full; dropping a message from %s", msg.sender[:16])
            return
        log.info(
            "message from %s in %s (%d bytes%s)", msg.sender[:16], msg.space,
            utf8_len(msg.text), "" if msg.authenticated else ", unverified",
        )  # fmt: skip

    async def _inbound_loop(self) -> None:
        while True:
            inbound = await self._inbound.get()
            assert self._on_message is not None
            try:
                await self._on_message(inbound)
            except Exception:  # loop boundary: one bad message must not stop the radio
                log.exception("storing a message from %s failed", inbound.sender[:16])
            finally:
                self._inbound.task_done()

    # --- tasks, health, the operator's view ---------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._broken = task.get_name()
            log.error("meshcore task ended unexpectedly", exc_info=task.exception())

    def health(self) -> TransportHealth:
        if self._closed.is_set() or self._stopping:
            return TransportHealth(link="closed", outbox=len(self.outbox.jobs))
        up = self._companion is not None and not self._lost.is_set()
        link = "up" if up else "connecting" if self._connecting else "down"
        detail = f"loop {self._broken} died" if self._broken else "" if up else self._lost_reason
        if up and not detail:
            firmware = self.device.get("ver") or "firmware ?"
            detail = f"node {self._name!r}, {firmware}"
        if self.hung and up:
            detail = f"re-opened {self.hung} time(s) after the companion stopped answering"
        problem = ""
        if self.contacts_full:
            problem = (
                "the companion's contact table is full: new nodes cannot DM the bot. Fix: "
                "remove old contacts in the app or with meshcore-cli"
            )
        return TransportHealth(
            link=link, loop_ok=not self._broken, detail=detail, outbox=len(self.outbox.jobs),
            problem=problem,
        )  # fmt: skip

    def mesh_view(self) -> MeshView:
        now = self._clock.monotonic()
        pacer = self.outbox.pacer
        companion = self._companion
        contacts = companion.contacts() if companion is not None else {}
        nodes = contact_nodes(contacts, self._nodes)
        return MeshView(
            link=self.health().link,
            channel_utilization=pacer.fresh(now).channel_utilization,
            air_util_tx=None,
            bot_hour_share=pacer.own_share(now, 3600.0),
            others=pacer.others(now),
            channel_limit=self._cfg.busy_threshold,
            duty_cycle=self._cfg.duty_cycle,
            holding="",
            holds={},
            outbox_waiting=len(self.outbox.jobs),
            nodes=nodes,
        )


def _book_id(sender: str) -> str:
    """A node's id in the operator's view: a key's 12-digit prefix, a channel name as is."""
    return sender if sender.startswith("~") else sender[:12]


def _resolve(companion: Companion, prefix: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (key, str(c.get("adv_name") or ""))
        for key, c in companion.contacts().items()
        if key.lower().startswith(prefix)
    )


def build_meshcore(
    config: MeshCoreConfig,
    *,
    bot_name: str,
    command_prefix: str,
    command_names: tuple[str, ...] = (),
    opener: Opener | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    wall: Callable[[], float] = time.time,
) -> MeshCoreTransport:
    """The MeshCore transport for ``config``; ``opener``/``clock``/``wall`` are for tests."""
    problem = config.link_problem()
    if problem is not None:
        raise TransportError(problem)
    return MeshCoreTransport(
        config=config,
        bot_name=bot_name,
        command_prefix=command_prefix,
        command_names=command_names,
        opener=opener or open_companion,
        clock=clock or SystemClock(),
        rng=rng,
        wall=wall,
    )


@contextlib.asynccontextmanager
async def running(transport: MeshCoreTransport, on_message: OnMessage) -> AsyncIterator[None]:
    """``async with running(t, handler):`` start, then always stop (tests, tools)."""
    await transport.start(on_message)
    try:
        yield
    finally:
        await transport.stop()
