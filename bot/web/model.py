"""What the web view shows, gathered in one ``Snapshot`` from the parts the app already has.

Invariants:
- Read-only: the collector calls the monitor's status (``bot.ops.status``: the same truth
  ``meshsage status`` prints), the transports' ``health``/``mesh_view``, the responder's
  counters and queue counts, and two grouped, indexed-or-small queries on the store (outbox
  rows by state and age; other gateways seen in the outbox). It never writes.
- Counts, states and timings only: no message text, and no person identifiers outside the
  nodes list (node ids and names are what the radio itself broadcasts to everyone).
- A store that fails or hangs does not stop the view: the snapshot says what failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from bot.memory.port_work import Outbox
from bot.ops import backup as backup_order
from bot.ops import status as status_file
from bot.ops.metrics import Counters, LastError, Latencies
from bot.transports.base import Transport
from bot.transports.mesh_view import MeshView

QUERY_TIMEOUT = 5.0
GATEWAY_WINDOW = 86_400.0  # another gateway is "seen" when it queued a reply this recently
OUTBOX_STATES = ("pending", "sent", "delivered", "failed", "expired")


@runtime_checkable
class ShowsMesh(Protocol):
    def mesh_view(self) -> MeshView: ...


class Collects(Protocol):
    async def collect(self) -> Snapshot: ...


@dataclass(frozen=True)
class OutboxState:
    state: str
    rows: int
    oldest_age: float | None  # seconds since the oldest row in this state was queued


@dataclass(frozen=True)
class Snapshot:
    at: float
    status: status_file.Status
    model: str
    context_tokens: dict[str, int]
    llm_failures: int
    llm_last_ok: bool | None
    llm_total: int
    llm_seconds_total: float
    llm_buckets: tuple[int, ...]
    totals: dict[str, int]
    first_reply_p50: float | None
    first_reply_total: float
    first_part_total: float
    first_part_count: int
    people_waiting: int
    turns_waiting: int
    outbox: tuple[OutboxState, ...]
    mesh: MeshView | None
    gateway: str | None  # this gateway's name on a shared (PostgreSQL) store
    other_gateways: tuple[tuple[str, float], ...]  # (name, seconds since seen)
    last_backup: tuple[str, float] | None  # (file name, epoch) of the newest backup
    errors: tuple[tuple[float, str], ...]
    store_problem: str = ""
    transports: tuple[str, ...] = field(default_factory=tuple)


class Collector:
    def __init__(
        self,
        *,
        status: Callable[[], Awaitable[status_file.Status]],
        transports: Callable[[], Sequence[Transport]],
        store: Outbox,
        latencies: Latencies,
        counters: Counters,
        last_error: LastError,
        waiting: Callable[[], tuple[int, int]],
        model_name: Callable[[], str],
        backups: Path,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._status = status
        self._transports = transports
        self._store = store
        self._latencies = latencies
        self._counters = counters
        self._last_error = last_error
        self._waiting = waiting
        self._model_name = model_name
        self._backups = backups
        self._clock = clock

    async def collect(self) -> Snapshot:
        now = self._clock()
        status = await self._status()
        transports = list(self._transports())
        mesh = next((t.mesh_view() for t in transports if isinstance(t, ShowsMesh)), None)
        outbox: tuple[OutboxState, ...] = ()
        others: tuple[tuple[str, float], ...] = ()
        problem = ""
        try:
            async with asyncio.timeout(QUERY_TIMEOUT):
                outbox = await outbox_states(self._store, now=now)
                others = await other_gateways(self._store, now=now)
        except TimeoutError:
            problem = f"the database did not answer within {QUERY_TIMEOUT:g} s"
        except Exception as exc:  # view boundary: a failing store is shown, not raised
            problem = f"the database query failed ({exc})"
        people, turns = self._waiting()
        first = sorted(self._counters.first_reply)
        return Snapshot(
            at=now,
            status=status,
            model=self._model_name(),
            context_tokens={t.name: t.limits.context_tokens for t in transports},
            llm_failures=self._latencies.failures,
            llm_last_ok=self._latencies.last_ok,
            llm_total=self._latencies.total,
            llm_seconds_total=self._latencies.total_seconds,
            llm_buckets=tuple(self._latencies.buckets),
            totals=dict(self._counters.totals),
            first_reply_p50=first[(len(first) - 1) // 2] if first else None,
            first_reply_total=self._counters.first_reply_total,
            first_part_total=self._counters.first_part_total,
            first_part_count=self._counters.first_part_count,
            people_waiting=people,
            turns_waiting=turns,
            outbox=outbox,
            mesh=mesh,
            gateway=self._store.outbox_gateway,
            other_gateways=others,
            last_backup=newest_backup(self._backups),
            errors=tuple(self._last_error.recent),
            store_problem=problem,
            transports=tuple(t.name for t in transports),
        )


async def outbox_states(store: Outbox, *, now: float) -> tuple[OutboxState, ...]:
    """Outbox rows by state with the age of the oldest (this gateway's rows on PostgreSQL)."""
    found = await store.outbox_by_state()
    return tuple(
        OutboxState(
            state,
            found[state][0] if state in found else 0,
            max(0.0, now - found[state][1]) if state in found else None,
        )
        for state in OUTBOX_STATES
    )


async def other_gateways(store: Outbox, *, now: float) -> tuple[tuple[str, float], ...]:
    """Other gateways sharing the store that queued a reply within ``GATEWAY_WINDOW``, with
    how long ago (SQLite: none, it has one gateway)."""
    rows = await store.outbox_gateways(since=now - GATEWAY_WINDOW)
    return tuple((name, max(0.0, now - at)) for name, at in rows)


def newest_backup(directory: Path) -> tuple[str, float] | None:
    """The newest file ``meshsage backup`` wrote into ``directory`` (the timer's), if any: the
    one written last (``bot.ops.backup``'s order, whatever a wrong clock named it), else by
    modification time."""
    with contextlib.suppress(OSError):
        last = backup_order.newest(directory)
        if last is not None:
            return last.name, last.stat().st_mtime
    best: tuple[str, float] | None = None
    with contextlib.suppress(OSError):
        for p in directory.iterdir():
            if p.name.startswith("meshsage-") and not p.name.startswith("."):
                with contextlib.suppress(OSError):
                    mtime = p.stat().st_mtime
                    if best is None or mtime > best[1]:
                        best = (p.name, mtime)
    return best
