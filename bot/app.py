"""The one wiring place: builds every part from the config, owns startup and shutdown.

Invariants:
- Nothing else constructs collaborators (the turn pipeline's parts are composed by the one
  factory ``build`` calls, ``bot.responder.build_responder``); classes receive them as
  keyword arguments and are never patched after construction.
- Adapter modules for Meshtastic and Discord are imported only when their section is enabled
  (``bot.app_edges`` builds the transports, the relay bridge and the web view for ``build``).
- A transport that fails to start is logged and left out; the others keep running. The app
  ends when it is asked to stop, or when every transport has ended by itself (console EOF).
- Shutdown order: stop taking turns and finish the ones in flight (replies still go out),
  stop transports, stop background summaries and indexing, close the LLM and embedding
  clients, close the database. The whole shutdown shares ONE deadline (``STOP_SECONDS``, below
  systemd's TimeoutStopSec=45): the drain ends by 60% of it, the transports by 80%, the
  background steps and clients by 88%, a cut step may unwind until 90%, and the database
  close has the rest. A step still running at its end is
  cancelled and left behind (never awaited past it); what it did not finish stays in the
  outbox as ``pending`` under this process's claim, released and sent at the next start.
- The store is SQLite in the state dir unless ``storage.url`` names another file or a
  PostgreSQL database (several gateways sharing one memory; ``bot.memory.open``).
- Operations: once the transports run, a ``Monitor`` task checks health, pings the systemd
  watchdog only while healthy, sends STATUS= lines and rewrites the status file in the state
  dir; READY=1 follows the transports' start, STOPPING=1 opens the shutdown. The LLM the gate
  uses is wrapped in ``TimedLLM`` for the latency figures.
- Sessions (close, summarize, extract facts) run in their own owned task through the gate's
  background lane, only while no turn runs; forgetting by use runs in the maintenance loop.
  A chat (the console the only transport) summarizes the sessions that ended before it exits
  (``finish_before_exit``: at most ``EXIT_SUMMARY_SECONDS``, a second Ctrl-C skips it).
- Embeddings (``memory.embeddings``) are built only when enabled: the embedder goes to the
  retriever (query vectors) and to the indexer (message vectors, in the background).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from bot.answering import unavailable_notice
from bot.app_edges import build_bridge, build_transport, build_web
from bot.bridge import Bridge
from bot.chat_settings import ChatSettings
from bot.clock import CLOCK_FILE, ClockWatch, SyncState, SystemSync
from bot.commands import Commands
from bot.commands_facts import FactCommands
from bot.commands_settings import SettingsCommands
from bot.config import Config
from bot.errors import MeshsageError
from bot.identity import PinnedKeys, configured_keys, policy_for
from bot.llm.gate import LLMGate
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import LLM
from bot.llm.server_limits import LearnedLimits, no_limit
from bot.llm.server_record import RECORD_FILE, ServerRecord
from bot.llm.tokens import TokenCounter, make_counter
from bot.memory.context import ContextBuilder
from bot.memory.embeddings import Embedder, OpenAICompatEmbedder
from bot.memory.facts import FactExtractor
from bot.memory.indexer import Indexer
from bot.memory.keep import outbox_cutoff
from bot.memory.layers import LayeredContext
from bot.memory.links import LinkCodes
from bot.memory.open import open_url
from bot.memory.retrieval import Retriever
from bot.memory.sessions import SessionKeeper, finish_before_exit
from bot.memory.store import SqliteStore
from bot.memory.summary import Summarizer
from bot.ops.metrics import Counters, LastError, Latencies, TimedLLM
from bot.ops.monitor import Monitor
from bot.ops.sdnotify import Notifier
from bot.ops.status import STATUS_FILE, Status, report_path
from bot.responder import Responder, build_responder
from bot.transports.base import Transport
from bot.transports.mesh_keys import Identifies

if TYPE_CHECKING:
    from bot.memory.postgres import PostgresStore
    from bot.web.server import WebServer

log = logging.getLogger("bot.app")

STOP_SECONDS = 30.0  # the whole shutdown; systemd's TimeoutStopSec=45 kills after that
DRAIN_SHARE = 0.6  # LLM calls in flight may finish until this share of the budget
DRAIN_SECONDS = STOP_SECONDS * DRAIN_SHARE
TRANSPORTS_SHARE = 0.8  # the relay and the transports stop by this share
STEPS_SHARE = 0.88  # the background steps and the clients by this share
GRACE_SHARE = 0.9  # a cut step may unwind until then; the rest is the database close's
RETENTION_INTERVAL = 6 * 3600.0
MAINTENANCE_INTERVAL = 10.0
EXIT_SUMMARY_SECONDS = 60.0  # a chat's ended session is summarized before exit, this long


@dataclass
class App:
    config: Config
    store: SqliteStore | PostgresStore
    llm: LLM
    gate: LLMGate
    counter: TokenCounter
    context: LayeredContext
    summarizer: Summarizer
    commands: Commands
    responder: Responder
    transports: list[Transport] = field(default_factory=list)
    indexer: Indexer | None = None  # memory.embeddings enabled
    notifier: Notifier = field(default_factory=lambda: Notifier(env={}))
    latencies: Latencies = field(default_factory=Latencies)
    last_error: LastError = field(default_factory=LastError)
    monitor: Monitor | None = None
    _monitor_task: asyncio.Task[None] | None = None
    _hurry: asyncio.Event = field(default_factory=asyncio.Event)
    sessions: SessionKeeper | None = None
    _close_llm: OpenAICompatLLM | None = None
    _close_embedder: OpenAICompatEmbedder | None = None
    _maintenance: asyncio.Task[None] | None = None
    bridge: Bridge | None = None  # relay: pairs configured
    stop_seconds: float = STOP_SECONDS  # the one shutdown deadline (tests shorten it)
    cut_at_stop: list[str] = field(default_factory=list)  # steps the deadline cut off
    web: WebServer | None = None  # web.enabled: the operator's web view and /metrics
    server_limits: LearnedLimits | None = None  # what the LLM server holds (the real adapter)
    trust: ClockWatch = field(default_factory=lambda: ClockWatch(sync=SystemSync()))
    status_path: Path | None = None  # None: in the state dir (bot.ops.status.report_path)
    pins: PinnedKeys | None = None  # who speaks on the mesh (bot.identity)
    say: Callable[[str], None] = field(default=lambda line: log.info("%s", line))  # chat: stderr

    async def start(self) -> list[Transport]:
        """Start transports; return the ones running. Raises when none could start."""
        running: list[Transport] = []
        for transport in self.transports:
            self.responder.attach(transport)
            try:
                await transport.start(self.responder.handle)
            except MeshsageError as exc:
                log.error("transport %s not started: %s", transport.name, exc)
                continue
            running.append(transport)
            log.info("transport %s launched (it logs its own connection state)", transport.name)
        if not running:
            raise MeshsageError("no transport could start; see the messages above.")
        self.transports = running
        await self.trust.refresh()  # before recovery: whether stored dates may be acted on
        self._maintenance = asyncio.create_task(self._maintenance_loop(), name="maintenance")
        if self.indexer is not None:
            self.indexer.start()
        if self.sessions is not None:
            self.sessions.start()
        if self.server_limits is not None:  # before the first turn: answers fit the server
            await self.server_limits.refresh()
        await self.responder.recover_pending()
        self._start_monitor()
        if self.web is not None:
            try:
                await self.web.start()
            except MeshsageError as exc:  # the bot still serves people; the operator is told
                log.error("%s", exc)
                self.web = None
        elif self._web_address():  # `run` without a view: how to get one
            log.info("web view %s", self._web_address())
        self.notifier.ready("serving on " + ", ".join(t.name for t in running))
        return running

    def _mesh_pins(self) -> bool:
        return self.pins is not None and any(isinstance(t, Identifies) for t in self.transports)

    def _identity_counts(self) -> dict[str, int]:
        return self.pins.counts() if self.pins is not None else {}

    def _relay_counters(self) -> dict[str, int]:
        return dict(self.bridge.counters) if self.bridge is not None else {}

    def _start_monitor(self) -> None:
        logging.getLogger("bot").addHandler(self.last_error)
        self.monitor = Monitor(
            notifier=self.notifier,
            store=self.store,
            transports=lambda: self.transports,
            status_path=self._status_path(),
            latencies=self.latencies,
            last_error=self.last_error,
            relay=self._relay_counters if self.bridge is not None else None,
            llm_limits=self._llm_limits,
            identity=self._identity_counts if self._mesh_pins() else None,
            web=self._web_address,
        )
        self._monitor_task = asyncio.create_task(self.monitor.run(), name="monitor")

    def _status_path(self) -> Path:
        return self.status_path or self.config.database_path.parent / STATUS_FILE

    def _web_address(self) -> str:
        """Where the web view is served, for the status and the run log ("": a chat)."""
        if all(t.name == "console" for t in self.transports):
            return ""  # chat and the memory tools serve no view
        from bot.web.checks import web_address

        return web_address(self.config, None if self.web is None else self.web.address)

    def _llm_limits(self) -> str:
        """What the server holds (learned at start) and how fast it reads a prompt."""
        limits = self.server_limits.describe() if self.server_limits is not None else ""
        speed = self.gate.describe_speed(self.config.memory.retrieval.recall_seconds)
        return "; ".join(part for part in (limits, speed) if part)

    async def status_now(self) -> Status:
        """A report as ``meshsage status`` reads it, collected now by the monitor (its file
        may be one interval old; the web view shows links as they are)."""
        if self.monitor is None:
            raise MeshsageError("the monitor is not running yet")
        return await self.monitor.collect()

    async def _maintenance_loop(self) -> None:
        """Database upkeep off the reply path: WAL checkpoints and small FTS merges while no
        turn is running, and retention every few hours."""
        next_retention = 0.0
        while True:
            try:
                await self.trust.refresh()
                if self.config.memory.retention_days > 0 and time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + RETENTION_INTERVAL
                    await self.retention()
                if self.config.memory.max_turns_per_person > 0 and self.responder.idle:
                    forgotten = await self.store.prune_by_use(
                        self.config.memory.max_turns_per_person
                    )
                    if forgotten:
                        log.info("forgetting by use: deleted %d little-used old message(s)",
                                 forgotten)  # fmt: skip
                # Finished rows hold answers' text: gone after their hour whatever the
                # retention settings (bot.memory.keep), on a clock the bot trusts.
                if self.trust.trusted():
                    await self.store.prune_outbox(outbox_cutoff(time.time()))
                await self.responder.redeliver()  # replies whose link was down
                await self.responder.take_over_stale()  # questions of a gateway that died
                if self.responder.idle:
                    await self.store.tidy()
            except Exception:  # loop boundary: upkeep must never stop the bot; try next round
                log.exception("database maintenance failed")
            await asyncio.sleep(MAINTENANCE_INTERVAL)

    async def retention(self) -> int:
        """Delete what ``memory.retention_days`` no longer keeps, by a date the clock can vouch
        for (``bot.clock``: nothing on a clock not trusted yet, never a row written before a
        step whose corrected date is still within the window)."""
        days = self.config.memory.retention_days
        if days <= 0:  # 0 keeps everything
            return 0
        cutoff = self.trust.retention_cutoff(days * 86_400.0)
        if cutoff is None:
            log.info("retention skipped: the wall clock is not trusted yet (bot.clock)")
            return 0
        pruned = await self.store.prune_older_than(cutoff)
        if pruned:
            log.info("retention: deleted %d message(s) older than %d days", pruned, days)
        return pruned

    async def run(self, stop: asyncio.Event) -> bool:
        """Start, serve until ``stop`` is set or every transport ends, then shut down.
        Returns True when the transports ended by themselves (nobody asked to stop)."""
        try:
            await self.start()
            stopper = asyncio.create_task(stop.wait())
            all_closed = asyncio.create_task(self._all_closed())
            await asyncio.wait([stopper, all_closed], return_when=asyncio.FIRST_COMPLETED)
            for task in (stopper, all_closed):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(stopper, all_closed, return_exceptions=True)
            chat = all(t.name == "console" for t in self.transports)
            if chat and self.sessions is not None and not self._hurry.is_set():
                await finish_before_exit(
                    self.sessions, timeout=EXIT_SUMMARY_SECONDS, say=self.say, skip=self._hurry
                )
            return not stop.is_set()
        finally:
            await self.close()

    def hurry(self) -> None:
        """Stop waiting for turns in flight (a second Ctrl-C); they are cut off and answered
        at the next start (their messages stay pending)."""
        self._hurry.set()

    async def _drain(self, timeout: float) -> None:
        drainer = asyncio.create_task(self.responder.drain(timeout=timeout))
        hurry = asyncio.create_task(self._hurry.wait())
        await asyncio.wait([drainer, hurry], return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        if not drainer.done():
            await self.responder.drain(timeout=0)  # cancels what is still running
        await drainer

    async def _step(
        self, name: str, step: Awaitable[object], until: float, grace_until: float
    ) -> None:
        """Run one shutdown step until the loop time ``until``. Past it the step is cancelled
        and may unwind until ``grace_until``, then it is left behind (never awaited past it).
        Errors are logged; the next steps still run."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(step)
        done, _ = await asyncio.wait({task}, timeout=max(0.0, until - loop.time()))
        if not done:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=max(0.0, grace_until - loop.time()))
            self.cut_at_stop.append(name)
            log.warning(
                "shutdown: %s did not finish within the stop budget (%.0f s): %s", name,
                self.stop_seconds, "cancelled" if done else "cancelled, left running",
            )  # fmt: skip
        if done and not task.cancelled() and task.exception() is not None:
            log.error("shutdown: %s failed", name, exc_info=task.exception())

    async def _all_closed(self) -> None:
        await asyncio.gather(*(t.wait_closed() for t in self.transports))

    async def close(self) -> None:
        """Shut down within ``stop_seconds`` in total (see the module docstring)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.stop_seconds
        grace_end = start + self.stop_seconds * GRACE_SHARE  # shared by every cut step

        async def step(name: str, awaitable: Awaitable[object], share: float = STEPS_SHARE) -> None:
            await self._step(name, awaitable, start + self.stop_seconds * share, grace_end)

        self.notifier.stopping()
        if self.web is not None:
            await step("the web view", self.web.stop())
        if self._monitor_task is not None:
            if self.monitor is not None:
                self.monitor.stop()
            self._monitor_task.cancel()
            await step("the monitor", self._monitor_task)
            logging.getLogger("bot").removeHandler(self.last_error)
            with contextlib.suppress(OSError):  # a stopped bot has no status to report
                self._status_path().unlink()
        if self._maintenance is not None:
            self._maintenance.cancel()
            await step("maintenance", self._maintenance)
        drain_end = start + self.stop_seconds * DRAIN_SHARE
        await step("the drain", self._drain(max(0.0, drain_end - loop.time())))
        if self.bridge is not None:
            await step("the relay", self.bridge.close(), TRANSPORTS_SHARE)
        for transport in self.transports:
            await step(f"stopping {transport.name}", transport.stop(), TRANSPORTS_SHARE)
        await step("summaries", self.summarizer.stop())
        if self.sessions is not None:
            await step("sessions", self.sessions.stop())
        if self.indexer is not None:
            await step("the indexer", self.indexer.stop())
        if self._close_llm is not None:
            await step("the LLM client", self._close_llm.close())
        if self._close_embedder is not None:
            await step("the embedding client", self._close_embedder.close())
        await self._step("the database", self.store.close(), deadline, deadline)
        self.notifier.close()
        took = loop.time() - start
        if self.cut_at_stop:
            log.warning("stopped in %.1f s; cut off: %s (what they did not send stays in the "
                        "outbox and goes out at the next start)", took,
                        ", ".join(self.cut_at_stop))  # fmt: skip
        else:
            log.info("stopped cleanly in %.1f s", took)


async def build(
    config: Config,
    *,
    env: Mapping[str, str],
    llm: LLM | None = None,
    stdin: IO[bytes] | None = None,
    stdout: IO[str] | None = None,
    transports: list[Transport] | None = None,
    only: list[str] | None = None,
    wall: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
    sync: SyncState | None = None,
) -> App:
    """Wire the app. ``llm``/``transports`` let tests substitute their own; ``only`` limits
    which configured transports are built (``meshsage chat`` uses ["console"]); ``wall`` is
    the clock that dates answers, closes sessions and fills ``{date}`` (a replay at a
    conversation's own dates passes its own); ``clock`` is the monotonic clock of rate-limit
    windows and outbox ages (the mesh soak passes its virtual clock); ``sync`` says whether the
    system's clock is synchronized (``bot.clock``; tests pass a fake)."""
    if config.storage.url is not None:  # sqlite:///file or postgresql:// (several gateways)
        store: SqliteStore | PostgresStore = await open_url(
            config.storage.url,
            password_env=config.storage.password_env,
            env=env,
            gateway=config.storage.gateway
            or f"{socket.gethostname()}:{config.database_path.parent}",
        )
    else:
        store = await SqliteStore.open(config.database_path)
    try:
        trust = ClockWatch(sync=sync or SystemSync(), path=config.database_path.parent / CLOCK_FILE)
        counter = make_counter()
        real_llm = None
        server_limits = None
        if llm is None:
            # structured-output mode and token ratio per server and model, kept across restarts
            record = ServerRecord(path=config.database_path.parent / RECORD_FILE)
            server_limits = LearnedLimits(
                base_url=config.llm.base_url, model=config.llm.model, record=record
            )
            real_llm = OpenAICompatLLM(
                config=config.llm, env=env, connection_lost=server_limits.mark_stale,
                counter=counter, record=record,
            )  # fmt: skip
            llm = real_llm
        # Background work (chapters, merges, facts, sessions) fits what the server holds.
        room = server_limits.room if server_limits is not None else no_limit
        latencies = Latencies()
        # Background LLM work waits while any turn is in progress (bound late: responder below).
        gate = LLMGate(
            llm=TimedLLM(llm=llm, latencies=latencies),
            limit=config.llm.concurrency,
            busy=lambda: not responder.idle,
            activity=lambda: responder.command_events,  # commands: a person at work
        )
        embedder: Embedder | None = None
        real_embedder = None
        indexer = None
        if config.memory.embeddings.enabled:
            real_embedder = OpenAICompatEmbedder(
                config=config.memory.embeddings, llm=config.llm, env=env
            )
            embedder = real_embedder
            indexer = Indexer(
                store=store,
                embedder=embedder,
                batch=config.memory.embeddings.batch,
                # catch-up batches wait while a turn runs (bound late: the responder is below)
                idle=lambda: responder.idle,
            )
        retriever = Retriever(
            store=store,
            counter=counter,
            config=config.memory.retrieval,
            embedder=embedder,
            embedding_weight=config.memory.embeddings.weight,
            min_similarity=config.memory.embeddings.min_similarity,
            query_timeout=config.memory.embeddings.query_timeout,
        )
        context = LayeredContext(
            inner=ContextBuilder(
                store=store,
                retriever=retriever,
                counter=counter,
                system_prompt=config.bot.system_prompt,
                retrieval_share=config.memory.retrieval.share,
                min_fold_messages=config.memory.summary.min_evicted,
                wall=wall,
                recall_room=lambda: gate.tokens_in(config.memory.retrieval.recall_seconds),
            ),
            store=store,
            counter=counter,
        )
        extractor = None
        if config.memory.extract_facts:
            extractor = FactExtractor(
                store=store,
                llm=gate.background,
                counter=counter,
                max_facts=config.memory.max_facts,
                room=room,
            )
        sessions = SessionKeeper(
            store=store,
            llm=gate.background,
            counter=counter,
            gap=config.memory.session_gap,
            extractor=extractor,
            idle=lambda: responder.idle,  # bound late: the responder is below
            wall=wall,
            room=room,
            upkeep=lambda: summarizer.merge_waiting(),  # bound late: the summarizer is below
        )
        summarizer = Summarizer(
            store=store,
            llm=gate.background,
            counter=counter,
            config=config.memory.summary,
            extractor=extractor,
            gate=gate,  # folds sized to what fits; a fold with no room runs as a debt
            room=room,
        )
        chat_settings = ChatSettings(store=store, personas=config.bot.personas)
        await chat_settings.load()
        listing = llm if isinstance(llm, OpenAICompatLLM) else None
        pins = PinnedKeys(store=store, configured=configured_keys(config))
        sender_policy = policy_for(config)  # who may do what (bot.trust)
        commands = Commands(
            store=store,
            facts=FactCommands(
                store=store,
                counter=counter,
                prefix=config.bot.command_prefix,
                max_facts=config.memory.max_facts,
            ),
            prefix=config.bot.command_prefix,
            operators=config.bot.operators,
            model_name=lambda: gate.model_name,
            links=LinkCodes(store),
            trust=sender_policy,
            pins=pins,
            settings=SettingsCommands(
                settings=chat_settings,
                list_models=listing.models if listing is not None else None,
                prefix=config.bot.command_prefix,
                configured_model=lambda: gate.model_name,
                is_operator=sender_policy.is_operator,
            ),
        )
        counters = Counters()
        responder = build_responder(
            counters=counters,
            store=store,
            llm=gate.foreground,
            context=context,
            summarizer=summarizer,
            commands=commands,
            counter=counter,
            config=config.bot,
            indexer=indexer,
            server=server_limits,
            settings=chat_settings,
            max_age={
                name: section.delivery.max_age
                for name, section in (
                    ("console", config.console),
                    ("meshtastic", config.meshtastic),
                    ("meshcore", config.meshcore),
                    ("discord", config.discord),
                )
                if section is not None
            },
            wall=wall,
            clock=clock,
            trust=trust,
            unavailable=unavailable_notice(
                config.llm.base_url, fallbacks=len(config.llm.fallbacks)
            ),
        )
        app = App(
            config=config,
            store=store,
            llm=llm,
            gate=gate,
            counter=counter,
            context=context,
            summarizer=summarizer,
            commands=commands,
            responder=responder,
            indexer=indexer,
            notifier=Notifier(env=env),
            latencies=latencies,
            sessions=sessions,
            _close_llm=real_llm,
            _close_embedder=real_embedder,
            server_limits=server_limits,
            trust=trust,
            status_path=report_path(config.database_path.parent, env),
            pins=pins,
        )
        if transports is None:
            names = only if only is not None else config.enabled_transports()
            transports = [
                build_transport(name, app, env=env, stdin=stdin, stdout=stdout) for name in names
            ]
        app.transports = transports
        for transport in transports:
            if isinstance(transport, Identifies):  # the mesh: who speaks (mesh_keys)
                transport.admission.pins = pins
        if config.web.enabled and only is None:  # `run` only: chat and the tools serve no view
            app.web = build_web(app, env=env, latencies=latencies, counters=counters)
        # chat, memory tools and reindex build one transport or none: no bridge to make
        if config.relay.pairs and only is None and transports:
            app.bridge = build_bridge(config, transports)
            bridge = app.bridge
            commands.stat_sources.append(bridge.stats)
        return app
    except BaseException:
        await store.close()
        raise
