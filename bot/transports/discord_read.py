"""Reading a discord.py ``Message`` into the text the model sees: DM detection, names for
mentions, the quoted message of a reply, and attachments. The policy lives in the pure
modules (``discord_text.readable``, ``discord_attach.merge``); this module only extracts.

Invariants:
- ``is_dm`` is decided by the channel type alone (``DMChannel``, or a partial channel typed
  private), never by a missing guild.
- ``quote`` quotes only what is visible in the channel (the replied-to message itself), at
  most ``QUOTE_MAX_CHARS``; it returns None for the asker's own message and for the bot's
  answer to the asker (``answered_to`` says whom an answer of ours was for). The quoted author
  is named as in ``discord_text.speaker`` (display name and id).
- ``read_attachments`` downloads only what ``discord_attach.wants_bytes`` allows; a failed
  download leaves the file named, not read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp
import discord

from bot.transports.discord_attach import Incoming, kind, merge, wants_bytes
from bot.transports.discord_text import readable, speaker

log = logging.getLogger("bot.transport.discord")

QUOTE_MAX_CHARS = 1500  # a replied-to message quoted as context
READ_ERRORS: tuple[type[BaseException], ...] = (
    discord.HTTPException,
    discord.ClientException,
    OSError,
    aiohttp.ClientError,
    TimeoutError,
)


def is_dm(channel: object) -> bool:
    return isinstance(channel, discord.DMChannel) or (
        isinstance(channel, discord.PartialMessageable)
        and channel.type == discord.ChannelType.private
    )


def readable_text(message: discord.Message, text: str) -> str:
    """Mentions, channels and custom emoji as the names people see, not ``<@123>``."""
    guild = message.guild
    users = {u.id: u.display_name for u in message.mentions}
    roles = {r.id: r.name for r in message.role_mentions}
    channels: dict[int, str] = {}
    for cid in message.raw_channel_mentions:
        found = guild.get_channel_or_thread(cid) if guild is not None else None
        if found is not None:
            channels[cid] = found.name
    return readable(text, users=users, roles=roles, channels=channels)


def quote(
    quoted: discord.Message, *, asker: int, me: int, answered_to: Callable[[int], int | None]
) -> str | None:
    """The replied-to message as quoted context: another person's message, or the bot's
    answer to someone else. A reply to the bot's answer to the asker needs no quote: that
    answer is already in the asker's conversation."""
    if quoted.author.id == asker:
        return None
    if quoted.author.id == me and answered_to(quoted.id) == asker:
        return None
    body = readable_text(quoted, quoted.content).strip()
    if not body:
        return None
    if len(body) > QUOTE_MAX_CHARS:
        body = body[: QUOTE_MAX_CHARS - 1] + "…"
    lines = "\n".join("> " + line for line in body.splitlines())
    who = quoted.author.display_name  # a person is named as in their own messages; we are us
    who = who if quoted.author.id == me else speaker(who, quoted.author.id)
    return f"(replying to {who}:)\n{lines}"


async def read_attachments(
    message: discord.Message, text: str, *, budget: int, vision: bool
) -> tuple[str, str | None, tuple[str, ...]]:
    """Text files read into ``text`` under their name; images and other files named; a note
    for the person saying what was not read (or None); images for a vision model."""
    found: list[tuple[Incoming, bytes | None]] = []
    taken = 0  # images to be downloaded so far: past the count, none is
    for att in message.attachments:
        seen = Incoming(att.filename, att.content_type, att.size)
        data: bytes | None = None
        if wants_bytes(seen, vision=vision, images_taken=taken):
            taken += kind(seen) == "image"
            try:
                data = await att.read()
            except READ_ERRORS as exc:
                log.warning("could not read an attachment of %s: %s", message.id, exc)
        found.append((seen, data))
    return merge(text, found, budget=budget, vision=vision)
