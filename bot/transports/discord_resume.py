"""Finishing what an interrupted Discord answer left on screen (a restart in mid-stream).

A streamed answer's messages are recorded by question as they are posted (``record``, see
``bot.delivery``). After a restart the same answer is shown again: by a new stream (the
question is answered again) or by ``send`` (its outbox row was already stored). Either reuses
the earlier messages here instead of posting a second answer under the half one.

Invariants:
- Earlier messages are reused in part order: ``take`` edits the next one into the given text
  and returns it. The first one that is gone (404: deleted by a moderator or the person) or
  cannot be edited (403) ends the reuse: it and every earlier message after it are deleted, so
  the parts posted new instead appear below the reused ones, in order; the log says so.
- ``drop`` deletes the earlier messages not reused (a shorter answer, or an aborted one); a
  message already gone counts as deleted. Each deletion is recorded (``record(part, None)``).
- Network trouble and Discord's 5xx are raised to the caller (transient: the outbox tries
  again later and the messages are still there to reuse).
"""

from __future__ import annotations

import logging
from typing import Any, cast

import discord

from bot.transports.base import ShownRecord
from bot.transports.discord_send import NO_MENTIONS, describe

log = logging.getLogger("bot.transport.discord")

# Discord refusing the edit of one message for good: post a new one instead.
GONE: tuple[type[BaseException], ...] = (discord.NotFound, discord.Forbidden, TypeError)


class Earlier:
    """The messages an earlier, interrupted showing of one answer left, to be reused."""

    def __init__(
        self, shown: tuple[tuple[int, str], ...] = (), record: ShownRecord | None = None
    ) -> None:
        self._left = [(part, int(pid)) for part, pid in sorted(shown) if pid.isdigit()]
        self._record = record

    def __bool__(self) -> bool:
        return bool(self._left)

    async def take(self, channel: discord.abc.Messageable, content: str) -> discord.Message | None:
        """The next earlier message, edited to show ``content``; None when there is none left
        (or it is gone: then the rest are deleted and the caller posts a new message)."""
        if not self._left:
            return None
        _part, message_id = self._left[0]
        try:
            message = await _partial(channel, message_id).edit(
                content=content, allowed_mentions=NO_MENTIONS
            )
        except GONE as exc:
            log.info(
                "a message of an interrupted answer cannot be edited (%s); the rest of the "
                "answer is posted anew",
                describe(exc),
            )
            await self.drop(channel)
            return None
        self._left.pop(0)
        return message

    async def drop(self, channel: discord.abc.Messageable) -> None:
        """Delete the earlier messages not reused."""
        while self._left:
            part, message_id = self._left[0]
            try:
                await _partial(channel, message_id).delete()
            except discord.NotFound:
                pass  # deleted already: what we wanted
            except GONE as exc:
                log.warning("could not delete a message of an interrupted answer: %s",
                            describe(exc))  # fmt: skip
            self._left.pop(0)
            if self._record is not None:
                await self._record(part, None)


def _partial(channel: discord.abc.Messageable, message_id: int) -> discord.PartialMessage:
    # Every channel an answer goes to (DM, text channel, thread, partial) supports partial
    # messages; anything else raises TypeError, handled as "cannot be edited".
    return discord.PartialMessage(channel=cast(Any, channel), id=message_id)
