"""Followed threads on Discord (``discord.follow_threads``): which threads the bot answers
without a mention, and when it stops.

Invariants:
- A thread is followed once a message there is admitted (an @mention, in an allowed channel:
  ``discord_policy.admit``) and stays followed while people talk in it; the mark and the time
  of the last message live in ``SeenMarks.followed`` (the catch-up file), so a restart keeps
  following and catch-up reads the thread.
- It stops on ``!stop`` there (answered with ``UNFOLLOWED``, not handed on), when the thread
  is archived or deleted, and after ``thread_idle`` seconds without a message.
- With ``open_threads`` a channel question (an @mention, not a command or a reply) gets a new
  thread opened from it, followed, and the question belongs to that thread's conversation,
  so the follow-ups there continue it. A refusal (no permission) answers in the channel.
- Nothing here posts except the one ``UNFOLLOWED`` line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import discord

from bot.config import DiscordConfig
from bot.domain import Inbound
from bot.transports.discord_catchup import SeenMarks
from bot.transports.discord_send import post

log = logging.getLogger("bot.transport.discord")

THREAD_NAME_MAX = 90  # Discord allows 100 characters
UNFOLLOWED = "I stop answering everything here. @mention me to bring me back to this thread."


class Threads:
    def __init__(
        self,
        *,
        config: DiscordConfig,
        marks: SeenMarks,
        prefix: str,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._marks = marks
        self._prefix = prefix
        self._now = now

    def followed(self, channel: object) -> bool:
        """Whether a message in ``channel`` needs no mention (a followed thread)."""
        return (
            isinstance(channel, discord.Thread)
            and self._config.follow_threads
            and self._marks.following(channel.id, self._now(), idle=self._config.thread_idle)
        )

    async def admitted(self, message: discord.Message, inbound: Inbound) -> bool:
        """An admitted message: (re)follow its thread. False when it was ``!stop`` (handled
        here, not to be handed on)."""
        thread = message.channel
        if not isinstance(thread, discord.Thread) or not self._config.follow_threads:
            return True
        if inbound.text.strip().lower() == f"{self._prefix}stop":
            self._marks.unfollow(thread.id)
            await post(thread, UNFOLLOWED, message.to_reference(fail_if_not_exists=False))
            return False
        self._marks.follow(thread.id, self._now())
        return True

    async def open_for(self, message: discord.Message, inbound: Inbound) -> discord.Thread | None:
        """With ``open_threads``: a thread opened from a channel message that @mentions the bot
        (not a command, not a reply), followed; the answer goes there. None: not for this
        message, or Discord refused (logged; the answer then goes to the channel)."""
        channel = message.channel
        if (
            not self._config.open_threads
            or not isinstance(channel, discord.TextChannel)
            or message.reference is not None
            or inbound.text.startswith(self._prefix)
        ):
            return None
        name = " ".join(inbound.text.split())[:THREAD_NAME_MAX] or "meshsage"
        try:
            thread = await message.create_thread(name=name, auto_archive_duration=1440)
        except (discord.HTTPException, discord.ClientException, ValueError) as exc:
            log.warning(
                "could not open a thread for message %s (%s); answering in the channel. Fix: "
                "give the bot Create Public Threads there, or set discord.open_threads: false",
                message.id,
                exc,
            )
            return None
        self._marks.follow(thread.id, self._now())
        return thread

    def ids(self) -> list[int]:
        """The threads followed now (for catch-up)."""
        now, idle = self._now(), self._config.thread_idle
        marks = self._marks
        return [t for t in list(marks.followed) if marks.following(t, now, idle=idle)]

    def register(self, client: discord.Client) -> None:
        async def on_raw_thread_update(payload: discord.RawThreadUpdateEvent) -> None:
            meta = payload.data.get("thread_metadata") or {}
            if meta.get("archived") and self._marks.unfollow(payload.thread_id):
                log.info("thread %s archived: no longer followed", payload.thread_id)

        async def on_raw_thread_delete(payload: discord.RawThreadDeleteEvent) -> None:
            self._marks.unfollow(payload.thread_id)

        client.event(on_raw_thread_update)
        client.event(on_raw_thread_delete)
