"""Discord catch-up: what was said while the bot was away (stopped, or a gateway session that
could not be resumed) is read from channel history and handled like live messages.

Invariants:
- ``SeenMarks`` keeps, per DM channel and per allowed channel, the id of the newest message the
  transport has handled (addressed or not). It is written to a small JSON file (atomic rename)
  as marks move, so a restart knows where it stopped; a missing or unreadable file means "no
  marks" (catch-up then reads back ``max_age``), never a crash.
- ``catch_up`` reads, per channel, at most ``max_messages`` messages newer than both the mark
  and ``now - max_age`` (the oldest first: Discord's ``after`` order), skips those whose
  platform id is already stored (``known``) and hands the rest, in order, to ``handle`` -- the
  same admission path as live messages, so only addressed messages are answered. Each message
  is therefore answered at most once across restarts.
- Per session at most ``MAX_DM_CHANNELS`` DM channels are read back (one request each), the
  most recently active first.
- One unreadable channel (deleted, no permission) is logged and skipped; the others go on.
- Followed threads (``SeenMarks.followed``, with the time of their last message) are kept in
  the same file; one silent for longer than ``thread_idle`` is let go when next looked at.
- ``read_back`` reads one channel's history before a message (a DM channel seen for the
  first time: what its person said while the bot was away, their first-ever DM included).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import discord

from bot.config import CatchUpConfig

log = logging.getLogger("bot.transport.discord")

MAX_DM_CHANNELS = 200  # DM channels read back per new session, the most recently active
Known = Callable[[Sequence[str], float], Awaitable[set[str]]]
Handle = Callable[[discord.Message], Awaitable[None]]
READ_ERRORS: tuple[type[BaseException], ...] = (
    discord.HTTPException,
    discord.ClientException,
    OSError,
    aiohttp.ClientError,
    TimeoutError,
)


class SeenMarks:
    """Newest handled message id per channel, optionally persisted to ``path``."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self.last: dict[int, int] = {}
        self.dms: set[int] = set()
        self.followed: dict[int, float] = {}  # thread id -> last message there (wall time)
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self.last = {int(k): int(v) for k, v in data.get("last", {}).items()}
            self.dms = {int(c) for c in data.get("dms", [])}
            self.followed = {int(k): float(v) for k, v in data.get("followed", {}).items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable catch-up marks in %s: %s", path, exc)
            self.last, self.dms, self.followed = {}, set(), {}

    def see(self, channel_id: int, message_id: int, *, dm: bool) -> None:
        changed = message_id > self.last.get(channel_id, 0) or (dm and channel_id not in self.dms)
        if not changed:
            return
        self.last[channel_id] = max(message_id, self.last.get(channel_id, 0))
        if dm:
            self.dms.add(channel_id)
        self._save()

    def follow(self, thread_id: int, now: float) -> None:
        """The thread is followed (again), active at ``now``."""
        self.followed[thread_id] = now
        self._save()

    def unfollow(self, thread_id: int) -> bool:
        if self.followed.pop(thread_id, None) is None:
            return False
        self._save()
        return True

    def following(self, thread_id: int, now: float, *, idle: float) -> bool:
        """Whether the thread is followed; one silent for ``idle`` seconds is let go."""
        last = self.followed.get(thread_id)
        if last is None:
            return False
        if now - last > idle:
            self.unfollow(thread_id)
            return False
        return True

    def _save(self) -> None:
        if self._path is None:
            return
        data = {
            "last": {str(k): v for k, v in self.last.items()},
            "dms": sorted(self.dms),
            "followed": {str(k): v for k, v in self.followed.items()},
        }
        tmp = self._path.with_suffix(".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self._path)
        except OSError as exc:  # a full disk must not stop answering; catch-up reads more
            log.warning("could not save catch-up marks to %s: %s", self._path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()


async def catch_up(
    client: discord.Client,
    *,
    channel_ids: Sequence[int],
    marks: SeenMarks,
    config: CatchUpConfig,
    known: Known | None,
    handle: Handle,
    now: float | None = None,
) -> int:
    """Read each channel's missed messages and hand the ones not stored to ``handle``; the
    number handed on."""
    if config.max_age <= 0 or config.max_messages <= 0:
        return 0
    since = (time.time() if now is None else now) - config.max_age
    floor = discord.utils.time_snowflake(datetime.fromtimestamp(since, UTC))
    handed = 0
    for cid in channel_ids:
        after = max(floor, marks.last.get(cid, 0))
        found = client.get_channel(cid)
        channel: discord.abc.Messageable
        if isinstance(found, discord.abc.Messageable):
            channel = found
        else:
            kind = discord.ChannelType.private if cid in marks.dms else None
            channel = client.get_partial_messageable(cid, type=kind)
        try:
            missed = [
                m
                async for m in channel.history(
                    limit=config.max_messages, after=discord.Object(id=after), oldest_first=True
                )
            ]
        except READ_ERRORS as exc:
            log.warning("catch-up: cannot read channel %s: %s", cid, exc)
            continue
        stored = await known([str(m.id) for m in missed], since) if known and missed else set()
        for message in missed:
            if str(message.id) in stored:
                marks.see(cid, message.id, dm=cid in marks.dms)
                continue
            await handle(message)
            handed += 1
    if handed:
        log.info("catch-up: %d missed Discord message(s) read from history", handed)
    return handed


async def read_back(
    channel: discord.abc.Messageable,
    before: discord.Message,
    *,
    config: CatchUpConfig,
    known: Known | None,
    handle: Handle,
) -> int:
    """Hand on what ``channel`` holds before ``before`` (within ``config``) and is not stored:
    a channel the bot has no mark for, seen now for the first time."""
    if config.max_age <= 0 or config.max_messages <= 0:
        return 0
    since = time.time() - config.max_age
    floor = discord.utils.time_snowflake(datetime.fromtimestamp(since, UTC))
    try:
        missed = [
            m
            async for m in channel.history(
                limit=config.max_messages,
                before=before,
                after=discord.Object(id=floor),
                oldest_first=True,
            )
        ]
    except READ_ERRORS as exc:
        log.warning("catch-up: cannot read a new DM channel: %s", exc)
        return 0
    stored = await known([str(m.id) for m in missed], since) if known and missed else set()
    handed = 0
    for message in missed:
        if str(message.id) not in stored:
            await handle(message)
            handed += 1
    if handed:
        log.info("catch-up: %d earlier message(s) of a new DM channel read from history", handed)
    return handed
