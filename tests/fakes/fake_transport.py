"""In-process transport for responder tests: inject ``Inbound`` values, collect ``Reply``s.

``byte_limit`` makes ``fit`` behave like a constrained transport (cut at a UTF-8 byte count),
so tests can check that what is stored is what was sent. It authenticates its senders, as
Discord and the console do (``say(..., authenticated=False)`` plays one that does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from bot.domain import DM_SPACE, Delivery, DeliveryStatus, Inbound, Reply, TransportLimits
from bot.text import fit_bytes
from bot.transports.base import OnMessage

_IDS = itertools.count(1)


class FakeTransport:
    def __init__(
        self,
        *,
        name: str = "fake",
        context_tokens: int = 1024,
        max_tokens: int = 100,
        byte_limit: int | None = None,
    ) -> None:
        self.name = name
        self.limits = TransportLimits(
            context_tokens=context_tokens, max_tokens=max_tokens, style_hint="Be brief."
        )
        self.byte_limit = byte_limit
        self.sent: list[Reply] = []
        self.refused: list[Reply] = []
        self.link_down = False
        self.working_for: list[str] = []
        self._on_message: OnMessage | None = None
        self._closed = asyncio.Event()
        self._sent_event = asyncio.Event()
        self._n = 0

    def fit(self, text: str) -> str:
        return text if self.byte_limit is None else fit_bytes(text, self.byte_limit)

    @contextlib.asynccontextmanager
    async def working(self, inbound: Inbound) -> AsyncIterator[None]:
        self.working_for.append(inbound.text)
        yield

    async def start(self, on_message: OnMessage) -> None:
        self._on_message = on_message

    async def send(self, reply: Reply) -> Delivery:
        if self.link_down:  # the durable outbox keeps the reply for later
            self.refused.append(reply)
            return Delivery(DeliveryStatus.PENDING, detail="link down")
        if 0 in reply.done_parts:  # as every transport: a recorded part is never sent again
            return Delivery(DeliveryStatus.DELIVERED)
        self.sent.append(reply)
        self._sent_event.set()
        pid = f"out-{len(self.sent)}"
        if reply.progress is not None:
            await reply.progress(0, pid)
        return Delivery(DeliveryStatus.DELIVERED, message_ids=(pid,))

    async def stop(self) -> None:
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def say(
        self,
        text: str,
        *,
        sender: str = "alice",
        space: str = DM_SPACE,
        message_id: str | None = None,
        authenticated: bool = True,
    ) -> None:
        """Deliver a message to the bot as a person would. Ids are unique across instances
        (as a platform's are), unless ``message_id`` repeats one on purpose."""
        assert self._on_message is not None, "start() first"
        self._n += 1
        await self._on_message(
            Inbound(
                transport=self.name,
                sender=sender,
                space=space,
                text=text,
                message_id=message_id or f"in-{next(_IDS)}",
                sender_name=sender,
                authenticated=authenticated,
            )
        )

    def texts(self) -> list[str]:
        return [r.text for r in self.sent]
