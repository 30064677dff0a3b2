"""The supervisor loop: health, the systemd watchdog, STATUS lines and the status file.

Invariants:
- One task, owned by the app, started after the transports and cancelled first at shutdown.
- ``WATCHDOG=1`` is sent only from a tick where the event loop ran this task on time, the store
  answered a trivial query within ``store_timeout``, and every transport reports its loops ok.
  A wedged event loop sends nothing at all (this task cannot run), so systemd's ``WatchdogSec``
  restarts the service; a wedged store or transport loop is reported and pings stop the same way.
- Health is never assumed: a transport whose ``wait_closed`` returned while the bot runs is
  ``stopped`` (the monitor owns one waiter task per transport, cancelled with it), whatever it
  reports; a transport's ``problem`` (a refused token, restarting after a failure) and an LLM
  outage (``Latencies``) make the report unhealthy, the STATUS= line say so and ``meshsage
  status`` (the container HEALTHCHECK) exit non-zero, with the fix in ``problems``. They do not
  stop the watchdog pings (``watchdog_ok``): a restart fixes neither, and would stop the
  transports that still serve people.
- The status file is rewritten (atomically), healthy or not, so ``meshsage status`` can say
  what is wrong: at a tick whose report differs from the last one written in anything but
  ``written_at``, and at least every ``heartbeat`` seconds (``STATUS_HEARTBEAT``: fresh while
  the bot lives). A failed write is tried again at the next tick; it is logged once per cause
  and never stops the bot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bot import __version__
from bot.files import private_dir
from bot.memory.store import SqliteStore
from bot.ops import status as status_file
from bot.ops.metrics import LastError, Latencies
from bot.ops.sdnotify import Notifier
from bot.transports.base import Transport, health_of
from bot.urls import redact

if TYPE_CHECKING:
    from bot.memory.postgres import PostgresStore

log = logging.getLogger("bot.ops.monitor")

STORE_TIMEOUT = 20.0  # a query waiting this long means the store is wedged


class Monitor:
    def __init__(
        self,
        *,
        notifier: Notifier,
        store: SqliteStore | PostgresStore,
        transports: Callable[[], Sequence[Transport]],
        status_path: Path,
        latencies: Latencies,
        last_error: LastError,
        relay: Callable[[], Mapping[str, int]] | None = None,
        llm_limits: Callable[[], str] | None = None,
        identity: Callable[[], Mapping[str, int]] | None = None,
        web: Callable[[], str] | None = None,
        interval: float = status_file.STATUS_INTERVAL,
        heartbeat: float = status_file.STATUS_HEARTBEAT,
        store_timeout: float = STORE_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._notifier = notifier
        self._store = store
        self._transports = transports
        self._path = status_path
        self._latencies = latencies
        self._last_error = last_error
        self._relay = relay
        self._identity = identity  # refused mesh DMs by reason (bot.identity)
        self._llm_limits = llm_limits
        self._web = web  # where the web view is served (``meshsage status`` shows it)
        wd = notifier.watchdog_interval
        self.interval = min(interval, wd / 3) if wd else interval
        self._heartbeat = heartbeat
        self._written = ""  # the last report written, with written_at zeroed ("": none yet)
        self._written_at = 0.0
        self._store_timeout = store_timeout
        self._clock = clock
        self.started_at = clock()
        self._status_line = ""
        self._write_failed = ""
        self._stopped = False
        self._store_name = store_name(store)
        self._ended: dict[int, asyncio.Future[None]] = {}  # id(transport) -> its wait_closed

    def stop(self) -> None:
        """Ends ``run`` at its next step, even if a cancel was lost."""
        self._stopped = True
        for waiter in self._ended.values():
            waiter.cancel()

    def _has_ended(self, transport: Transport) -> bool:
        waiter = self._ended.get(id(transport))
        if waiter is None:
            waiter = asyncio.ensure_future(transport.wait_closed())
            self._ended[id(transport)] = waiter
        return waiter.done() and not waiter.cancelled()

    async def run(self) -> None:
        try:
            while not self._stopped:
                try:
                    await self.tick()
                except Exception:  # loop boundary: monitoring must never stop the bot
                    log.exception("status update failed")
                await asyncio.sleep(self.interval)
        finally:
            for waiter in self._ended.values():
                waiter.cancel()

    async def tick(self) -> status_file.Status:
        snapshot = await self.collect()
        if snapshot.watchdog_ok:
            self._notifier.watchdog()
        line = self.status_line(snapshot)
        if line != self._status_line:
            self._status_line = line
            self._notifier.status(line)
        same = dataclasses.replace(snapshot, written_at=0.0).to_json()
        # abs(): a wall clock stepped back (NTP on a Pi) must not hold the heartbeat back
        if same == self._written and abs(snapshot.written_at - self._written_at) < self._heartbeat:
            return snapshot
        try:  # (with PostgreSQL only, nothing else creates the state directory)
            private_dir(self._path.parent)
            status_file.write_atomic(self._path, snapshot.to_json())
            self._written, self._written_at = same, snapshot.written_at
            self._write_failed = ""
        except OSError as exc:
            if str(exc) != self._write_failed:
                self._write_failed = str(exc)
                log.warning("cannot write the status file %s: %s", self._path, exc)
        return snapshot

    async def collect(self) -> status_file.Status:
        problems: list[str] = []
        now = self._clock()
        today: dict[str, int] = {}
        waiting: dict[str, int] = {}  # replies kept in the store's outbox, per transport
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
            # arrives as the query completes, and the app's shutdown would wait forever.
            async with asyncio.timeout(self._store_timeout):
                await self._store.ping()
            async with asyncio.timeout(self._store_timeout):
                today = await self._store.messages_since(_local_midnight(now))
            async with asyncio.timeout(self._store_timeout):
                waiting = await self._store.waiting_replies()
        except TimeoutError:
            problems.append(f"the database did not answer within {self._store_timeout:g} s")
        except Exception as exc:  # health boundary: any store failure is a health problem
            problems.append(f"the database failed a trivial query ({exc})")
        size = 0
        if isinstance(self._store, SqliteStore):
            size = _database_bytes(self._store.path)
        elif not problems:  # PostgreSQL: the server sizes the whole (shared) database
            with contextlib.suppress(Exception):  # health boundary, as above
                async with asyncio.timeout(self._store_timeout):
                    size = await self._store.database_bytes()
        transports = {}
        serving: list[str] = []  # problems a restart would not fix (not for the watchdog)
        for t in self._transports():
            h = health_of(t, ended=self._has_ended(t))
            outbox = h.outbox or waiting.get(t.name, 0)
            transports[t.name] = status_file.TransportStatus(
                link=h.link, ok=h.loop_ok, detail=h.detail, outbox=outbox, problem=h.problem
            )
            if not h.loop_ok:
                problems.append(f"{t.name}: {h.detail or 'a loop is not running'}")
            elif h.problem:
                queued = f" ({outbox} repl(ies) wait in the outbox)" if outbox else ""
                serving.append(f"{t.name} {h.link}{queued}: {h.problem}")
        lat = self._latencies
        if lat.outage_since is not None:
            since = datetime.datetime.fromtimestamp(lat.outage_since).strftime("%H:%M:%S")
            serving.append(
                f"LLM unavailable since {since}, {lat.outage_failures} failed call(s) (last: "
                f'{lat.last_failure}). People are told "LLM unavailable". Fix: start the LLM '
                "server or check llm.base_url and the model name; `meshsage doctor` tests it"
            )
        return status_file.Status(
            written_at=now,
            started_at=self.started_at,
            pid=os.getpid(),
            version=__version__,
            healthy=not problems and not serving,
            watchdog_ok=not problems,
            problems=problems + serving,
            transports=transports,
            messages_in_today=today.get("user", 0),
            messages_out_today=today.get("assistant", 0),
            llm_calls=len(self._latencies),
            llm_failed_calls=lat.failed,
            llm_outage_since=lat.outage_since,
            llm_outage_failures=lat.outage_failures,
            llm_last_failure=lat.last_failure,
            llm_p50_seconds=self._latencies.percentile(50),
            llm_p95_seconds=self._latencies.percentile(95),
            database_bytes=size,
            store=self._store_name,
            last_error_at=self._last_error.at,
            last_error=self._last_error.text,
            relay=dict(self._relay()) if self._relay is not None else {},
            identity=dict(self._identity()) if self._identity is not None else {},
            llm_limits=self._llm_limits() if self._llm_limits is not None else "",
            web=self._web() if self._web is not None else "",
        )

    @staticmethod
    def status_line(snapshot: status_file.Status) -> str:
        """One short line for ``systemctl status`` (STATUS=)."""
        links = ", ".join(f"{n} {t.link}" for n, t in sorted(snapshot.transports.items()))
        head = "serving" if snapshot.healthy else "UNHEALTHY: " + "; ".join(snapshot.problems)
        return f"{head}; {links}; today {snapshot.messages_in_today} in"


def store_name(store: SqliteStore | PostgresStore) -> str:
    """The store in words for the status and the run log, never with a password."""
    if isinstance(store, SqliteStore):
        return f"SQLite {store.path}"
    return f"PostgreSQL {redact(store.url)}"


def _local_midnight(now: float) -> float:
    day = datetime.datetime.fromtimestamp(now).date()
    return datetime.datetime.combine(day, datetime.time()).timestamp()


def _database_bytes(path: Path) -> int:
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(OSError):
            total += path.with_name(path.name + suffix).stat().st_size
    return total
