"""Followed threads on Discord (``discord.follow_threads``): which threads the bot answers
without a mention, and when it stops.

Invariants:
- A thread is followed once a message there is admitted (an @mention, in an allowed channel:
  ``discord_policy.admit``) and stays followed while people talk in it; the mark and the time
  of the last message live in ``SeenMarks.followed`` (the catch-up file), so a restart keeps
  following and catch-up reads the thread.
- It stops on ``!stop`` there (answered with ``UNFOLLOWED``, not handed on), when the thread
  is archived or deleted, and after ``thread_idle`` seconds without a message.
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
