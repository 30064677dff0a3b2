"""A streamed Discord answer: it appears with the first words and grows by message edits.

Invariants:
- Rounds of changes (the edit of the growing message, and the post of the next one when it
  passes 2,000 characters) are at least ``interval`` seconds apart on the injected clock;
  updates arriving faster are skipped (a later one shows their text), and ``finish`` waits
  (injected ``sleep``) for the interval before its last round. Discord's own limit (about
  5 edits per 5 s per channel) is therefore not reached by one answer at the default interval.
- What is shown is ``split_message`` of the text so far, at most ``max_parts`` messages: a part
  that passes 2,000 characters continues in a new message. The first message is a reply to
  the question (no ping); nothing can ping anyone.
- ``finish(reply)`` makes the messages show exactly ``split_message(reply.text)`` (+ the note
  line), the fitted text the responder stores: differing parts are edited, missing ones posted,
  surplus ones (a retry produced a shorter answer) deleted. It returns the ``Delivery`` with
  every part's id, and never raises for Discord trouble.
- ``abort`` deletes what was shown (the LLM failed; the person gets the notice instead).
- A failed edit during streaming stops further streaming edits; ``finish`` still reconciles.
  A part someone deleted (404: a moderator) is left deleted and the rest goes on: the answer
  is not failed for it.
- Each post carries this stream's nonce for its part (random per stream, or the one an earlier
  stream recorded for that part), recorded as ``NONCE_MARK`` before the post: a post repeated
  after a 5xx that came after Discord created the message gets that message back, not a copy.
  Discord unreachable (network, 5xx) while finishing yields ``PENDING``: the outbox keeps the
  row and a later ``send`` edits the messages shown (``Reply.shown``) into the answer.
- Every message posted (or deleted) is recorded at once (``record``), and the messages an
  interrupted earlier stream of the same answer left (``earlier``, ``discord_resume``) are
  reused in order before anything new is posted: after a restart the half answer on screen
  grows into the whole one, never followed by a second copy.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable

import discord

from bot.domain import Delivery, DeliveryStatus, Reply
from bot.transports.base import ShownRecord
from bot.transports.discord_resume import Earlier
from bot.transports.discord_send import NONCE_MARK, part_nonce, posted, transient
from bot.transports.discord_text import DISCORD_MAX_CHARS, split_message, units

log = logging.getLogger("bot.transport.discord")

Target = Callable[[], Awaitable[tuple[discord.abc.Messageable, discord.MessageReference | None]]]
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
NO_MENTIONS = discord.AllowedMentions.none()
STREAM_ERRORS: tuple[type[BaseException], ...] = (
    discord.HTTPException,
    discord.ClientException,
    OSError,
    TimeoutError,
    ValueError,
)


class DiscordStream:
    def __init__(
        self,
        *,
        target: Target,
        max_parts: int,
        interval: float,
        clock: Clock,
        sleep: Sleep,
        on_post: Callable[[discord.Message, int], None],
        note: Callable[[Reply], str | None],
        earlier: Earlier | None = None,
        record: ShownRecord | None = None,
        nonces: dict[int, str] | None = None,
    ) -> None:
        self._target = target
        self._nonces = nonces or {}  # part -> nonce an earlier stream posted it with
        self._salt = secrets.token_hex(8)
        self._max_parts = max_parts
        self._interval = interval
        self._clock = clock
        self._sleep = sleep
        self._on_post = on_post  # (message, head id): the transport remembers its own posts
        self._note = note
        self._earlier = earlier or Earlier()
        self._record = record
        self._messages: list[discord.Message] = []
        self._shown: list[str] = []
        self._last: float | None = None
        self._broken = False
        self._channel: discord.abc.Messageable | None = None
        self._reference: discord.MessageReference | None = None
        self.first_post: Callable[[], None] = lambda: None  # ends the typing indicator

    async def update(self, text: str) -> None:
        if self._broken or not text.strip():
            return
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            return  # too soon: a later update or finish shows it
        try:
            await self._show(split_message(text)[: self._max_parts], final=False)
        except STREAM_ERRORS as exc:
            log.debug("streaming edit failed; the final text follows: %s", exc)
            self._broken = True

    async def finish(self, reply: Reply) -> Delivery:
        parts = split_message(reply.text)
        note = self._note(reply)
        if note is not None:
            if parts and units(parts[-1] + "\n" + note) <= DISCORD_MAX_CHARS:
                parts[-1] += "\n" + note
            else:
                parts.append(note)
        if not parts:
            return Delivery(DeliveryStatus.FAILED, detail="nothing to send (empty reply)")
        if self._last is not None:
            wait = self._interval - (self._clock() - self._last)
            if wait > 0 and parts != self._shown:
                await self._sleep(wait)
        try:
            await self._show(parts, final=True)
            if reply.progress is not None:  # the answer's row exists only now
                for i, message in enumerate(self._messages):
                    await reply.progress(i, str(message.id))
        except STREAM_ERRORS as exc:
            retry = transient(exc)  # network, 5xx, or a 429 discord.py did not wait out
            log.warning("streamed answer could not be completed%s: %s",
                        " (tried again later)" if retry else "", exc)  # fmt: skip
            ids = tuple(str(m.id) for m in self._messages)
            status = DeliveryStatus.PENDING if retry else DeliveryStatus.FAILED
            return Delivery(status, ids, detail=str(exc))
        return Delivery(DeliveryStatus.DELIVERED, tuple(str(m.id) for m in self._messages))

    async def abort(self) -> None:
        for i, message in enumerate(self._messages):
            try:
                await message.delete()
                await self._note_shown(i, None)
            except STREAM_ERRORS as exc:
                log.debug("could not delete a partial answer: %s", exc)
        self._messages, self._shown = [], []
        try:
            if self._earlier:
                if self._channel is None:
                    self._channel, self._reference = await self._target()
                await self._earlier.drop(self._channel)
        except STREAM_ERRORS as exc:
            log.debug("could not delete an interrupted earlier answer: %s", exc)

    async def _note_shown(self, part: int, platform_id: str | None) -> None:
        if self._record is not None:
            await self._record(part, platform_id)

    async def _show(self, parts: list[str], *, final: bool) -> None:
        if self._channel is None:
            self._channel, self._reference = await self._target()
        changed = False
        for i, part in enumerate(parts):
            if i < len(self._messages):
                if self._shown[i] != part:
                    try:
                        self._messages[i] = await self._messages[i].edit(
                            content=part, allowed_mentions=NO_MENTIONS
                        )
                    except discord.NotFound:
                        # A moderator deleted this part while the answer grew: theirs to
                        # decide; the rest of the answer goes on (it used to fail whole).
                        log.info("part %d of a streamed answer was deleted in Discord; the "
                                 "rest goes on", i)  # fmt: skip
                    self._shown[i] = part
                    changed = True
                continue
            msg = await self._earlier.take(self._channel, part)
            if msg is None:
                nonce = self._nonces.get(i) or part_nonce(f"s{self._salt}", i)
                await self._note_shown(i, NONCE_MARK + nonce)
                msg = await posted(await self._post(part, nonce, first=not self._messages), part)
            elif not self._messages:
                self.first_post()
            self._messages.append(msg)
            self._shown.append(part)
            self._on_post(msg, self._messages[0].id)
            await self._note_shown(i, str(msg.id))
            changed = True
        if final:
            while len(self._messages) > len(parts):
                with contextlib.suppress(discord.NotFound):  # deleted by a moderator already
                    await self._messages.pop().delete()
                self._shown.pop()
                await self._note_shown(len(self._messages), None)
                changed = True
            if self._earlier:
                await self._earlier.drop(self._channel)
                changed = True
        if changed:
            self._last = self._clock()

    async def _post(self, content: str, nonce: str, *, first: bool) -> discord.Message:
        assert self._channel is not None
        if first:
            self.first_post()
        if first and self._reference is not None:
            return await self._channel.send(
                content,
                reference=self._reference,
                mention_author=False,
                allowed_mentions=NO_MENTIONS,
                nonce=nonce,
            )
        return await self._channel.send(content, allowed_mentions=NO_MENTIONS, nonce=nonce)
