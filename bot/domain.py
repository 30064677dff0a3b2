"""Domain values every part of meshsage speaks. No platform types live here.

Invariants:
- Every value is a frozen dataclass; transports build them, the responder and memory consume them.
- A ``ConversationKey`` is (transport, person, space). A DM is its own space (``DM_SPACE``), so
  nothing said in a DM shares a key with a channel conversation.
- Text in these values is already decoded ``str``; transports own decoding and platform limits.
- ``Inbound.authenticated`` is True only when the transport verified who sent the message:
  Discord (its login), the console (the machine's user), a Meshtastic DM that arrived
  PKI-encrypted with the key pinned for that node (``bot.transports.mesh_keys``). A mesh
  channel message, a mesh DM without PKI and anything a transport did not vouch for are not.
  It defaults to False, so a transport that forgets to set it is never trusted; memory,
  links and operator power follow it (``bot.trust``).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

DM_SPACE = "dm"


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ConversationKey:
    transport: str
    person: str
    space: str = DM_SPACE

    @property
    def is_dm(self) -> bool:
        return self.space == DM_SPACE

    def __str__(self) -> str:
        return f"{self.transport}:{self.person}@{self.space}"


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message addressed to the bot, after the transport dropped echoes and duplicates."""

    transport: str
    sender: str  # stable platform id: "!1234abcd", a Discord user id, the local user name
    text: str
    space: str = DM_SPACE  # DM_SPACE or a channel id/index as a string
    message_id: str | None = None  # the platform's id for this message
    reply_to: str | None = None  # platform id of the message this one replies to
    sender_name: str | None = None  # display name, for rendering only
    received_at: datetime = field(default_factory=utcnow)
    # Images as data: URLs for a vision model (``llm.vision``); shown to the model with this
    # message only, never stored (the stored text names them: "[image: cat.png]").
    images: tuple[str, ...] = ()
    # An edit of the earlier message ``message_id``: what is stored follows the new text, and
    # it is answered (again) where the answer would change; ``edit_only``: the edited message
    # no longer addresses the bot (a mention removed), so it is stored but never answered.
    edited: bool = False
    edit_only: bool = False
    # The transport verified the sender (see the module docstring); never derived from text.
    authenticated: bool = False

    @property
    def key(self) -> ConversationKey:
        return ConversationKey(self.transport, self.sender, self.space)

    @property
    def is_dm(self) -> bool:
        return self.space == DM_SPACE


class ReplyKind(enum.Enum):
    ANSWER = "answer"  # the model's answer; stored in memory
    COMMAND = "command"  # a command's output; not part of the conversation
    NOTICE = "notice"  # degradation notes: LLM unavailable, rate limited; never stored


@dataclass(frozen=True, slots=True)
class Reply:
    """Text for one person, already fitted to the transport's limits (see ``Transport.fit``)."""

    inbound: Inbound
    text: str
    kind: ReplyKind = ReplyKind.ANSWER
    note: str | None = None  # short degradation note the transport may show ("history trimmed")
    attachments: tuple[Attachment, ...] = ()
    # Durable delivery (the outbox): parts already out are skipped; every part the platform
    # accepts is reported through ``progress(part index, platform id)`` before the next one.
    outbox_id: int | None = None
    done_parts: frozenset[int] = frozenset()
    progress: PartProgress | None = None
    # Transports that choose packet ids (the mesh): ids planned for parts by an earlier send,
    # and ``plan(part index, packet id)`` to store one before the part is written; it returns
    # the id to use (one stored earlier wins), so a re-send repeats the same packet id.
    packet_ids: tuple[tuple[int, int], ...] = ()
    plan: PartPlan | None = None
    # Transports that edit what they showed (Discord): messages an interrupted stream of this
    # answer left on screen, (part index, platform id); they are edited into the answer's parts
    # instead of being followed by a second copy.
    shown: tuple[tuple[int, str], ...] = ()


PartProgress = Callable[[int, str], Awaitable[None]]
PartPlan = Callable[[int, int], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Attachment:
    filename: str
    data: bytes
    dm_only: bool = True  # exports always go to the person privately


class DeliveryStatus(enum.Enum):
    SENT = "sent"  # handed to the platform, no confirmation expected or received yet
    DELIVERED = "delivered"  # the platform confirmed delivery (mesh ACK, Discord 200)
    FAILED = "failed"  # gave up; the person did not receive all of it
    PENDING = "pending"  # not (all) sent: no link; the outbox keeps it and tries again later


@dataclass(frozen=True, slots=True)
class Delivery:
    status: DeliveryStatus
    message_ids: tuple[str, ...] = ()  # platform ids of the parts that went out
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """What the responder needs to know to size an answer for a transport."""

    context_tokens: int  # budget for the whole prompt
    max_tokens: int  # completion budget asked from the LLM
    style_hint: str  # one sentence added to the system prompt ("answer in under 200 bytes")
    # Shared spaces show who speaks (Discord channels: "Alice (id 930...): text", from the
    # stored author, ``Inbound.sender_name``); DMs never do.
    names_speakers: bool = False
