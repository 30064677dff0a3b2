"""The transport port: what the responder and the app need from any platform.

Invariants:
- A transport turns platform events into ``Inbound`` values after dropping its own echoes,
  duplicates and messages not addressed to the bot, then awaits ``on_message(inbound)``, which
  returns once the message is durably stored (the answer comes later through ``send``).
- ``fit(text)`` is pure and returns exactly what ``send`` will deliver for that text (after
  chunking and shortening), so the responder stores what the person actually receives.
- ``send`` never raises for platform trouble; it reports it in the returned ``Delivery``
  (``PENDING`` when the link is down: the responder's durable outbox tries again later). It
  skips ``reply.done_parts`` and awaits ``reply.progress(i, platform_id)`` for every part the
  platform accepted, before sending the next, so a crash never re-sends a recorded part.
- Optional capabilities are small runtime-checkable Protocols (``Paginates``, ``Congested``,
  ``KeepsFiles``); the responder uses them when a transport has them.
- Optional streaming (``Streams``): ``stream(inbound)`` returns an ``AnswerStream`` (or None
  when streaming is off for it); the responder feeds it the growing answer and ends it with
  ``finish`` (the fitted final text, which is what is stored) or ``abort``. Every message a
  stream posts is recorded (``record``) as it is posted; a stream after a restart, and a
  ``send`` of a reply with ``Reply.shown``, edit those messages instead of posting a second
  answer under a half one.
- ``start`` returns once the transport runs in the background; ``stop`` ends it within its own
  timeout; ``wait_closed`` returns when the transport has ended by itself (console EOF) and
  otherwise only after ``stop``.
- ``health()`` is optional (``health_of`` supplies a default): a cheap, non-blocking snapshot of
  the link and of whether the transport's own loops still run. ``loop_ok=False`` means a loop
  died or is wedged; the systemd watchdog then stops pinging so the service is restarted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bot.domain import Delivery, Inbound, Reply, TransportLimits

OnMessage = Callable[[Inbound], Awaitable[None]]


class AnswerStream(Protocol):
    async def update(self, text: str) -> None:
        """The answer so far (it may shrink when the LLM call is retried)."""
        ...

    async def finish(self, reply: Reply) -> Delivery:
        """Show exactly ``reply.text`` (already fitted); never raises for platform trouble."""
        ...

    async def abort(self) -> None:
        """The answer will not come: remove what was shown."""
        ...


ShownRecord = Callable[[int, str | None], Awaitable[None]]


@runtime_checkable
class Streams(Protocol):
    def stream(
        self,
        inbound: Inbound,
        *,
        shown: tuple[tuple[int, str], ...] = (),
        record: ShownRecord | None = None,
    ) -> AnswerStream | None:
        """``shown``: messages an earlier, interrupted stream of this answer left on screen
        (part index, platform id), to be reused in order rather than followed by new ones;
        ``record(part, platform id or None)`` is awaited for every message posted (or deleted)
        so that a restart can do the same."""
        ...


class Transport(Protocol):
    name: str
    limits: TransportLimits

    def fit(self, text: str) -> str:
        """What ``send`` would deliver for ``text``: the stored form of an answer."""
        ...

    def working(self, inbound: Inbound) -> AbstractAsyncContextManager[None]:
        """Held while the LLM works on ``inbound`` (Discord shows typing; others do nothing)."""
        ...

    async def start(self, on_message: OnMessage) -> None: ...

    async def send(self, reply: Reply) -> Delivery: ...

    async def stop(self) -> None: ...

    async def wait_closed(self) -> None: ...


@dataclass(frozen=True)
class TransportHealth:
    link: str  # "up", "connecting", "down", "closed" or "running" (no link to speak of)
    loop_ok: bool = True  # False: one of the transport's loops died or is wedged
    detail: str = ""  # why, in a few words (never message text)
    outbox: int = 0  # replies waiting to go out


@runtime_checkable
class ReportsHealth(Protocol):
    def health(self) -> TransportHealth: ...


def health_of(transport: Transport) -> TransportHealth:
    """The transport's own report, or "running" for transports that do not report."""
    if isinstance(transport, ReportsHealth):
        return transport.health()
    return TransportHealth(link="running")


@runtime_checkable
class Paginates(Protocol):
    """A transport that cuts long answers and can send the rest on ``!more``."""

    def fit_more(self, text: str) -> tuple[str, str | None]:
        """(what ``send`` delivers now, the rest for ``!more`` or None)."""
        ...


@runtime_checkable
class Congested(Protocol):
    """A transport whose outbox can fill up (the mesh): asked before calling the LLM."""

    def busy_for(self) -> float | None:
        """Seconds until the outbox has room again, or None when it has room now."""
        ...


@dataclass(frozen=True)
class Busy:
    """Why a congested transport cannot take a new reply now, and for about how long.

    ``cause``: ``"queue"`` (too many replies wait to go out: a new question is told to try
    again, not answered), ``"duty"`` (the hourly airtime is spent) or ``"channel"`` (other
    nodes fill the channel): on those holds a new question is answered into the outbox and
    sent when there is room. ``notice_now``: a one-packet notice can still go out soon."""

    cause: str
    seconds: float
    notice_now: bool = True


@runtime_checkable
class ExplainsBusy(Protocol):
    """A ``Congested`` transport that also says why (``Busy``)."""

    def busy(self) -> Busy | None: ...


@runtime_checkable
class KeepsFiles(Protocol):
    """A transport that writes files for people (console exports)."""

    def forget(self, person: str) -> int:
        """Delete the files written for ``person``; returns how many."""
        ...


@runtime_checkable
class Rereads(Protocol):
    """A transport that can read a message again after a restart (what was not stored, such
    as the images of a question for a vision model)."""

    async def reread(self, inbound: Inbound) -> Inbound:
        """``inbound`` with what only the platform kept (images); never raises."""
        ...


@runtime_checkable
class AwaitsAnswer(Protocol):
    """A transport where some inbounds must get a reply even when others would be silent (a
    Discord slash command shows "thinking..." until answered): a rate-limit notice is sent to
    each of them, not once per window."""

    def awaits_answer(self, inbound: Inbound) -> bool: ...
