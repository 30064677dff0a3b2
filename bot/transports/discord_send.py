"""Posting to Discord: where an answer goes, text messages that ping nobody, and files.

Invariants:
- ``reply_target`` answers in the channel of the message answered, as a reply to it; a
  message no longer in memory (answered after a restart) is rebuilt from the inbound's ids
  (a DM reopens the person's DM channel). A reference never fails the post if the message was
  deleted (``fail_if_not_exists=False``).
- Nothing posted can ping anyone (``AllowedMentions.none()``, no author ping on replies).
- An answer's part is posted with a nonce that names it (``part_nonce``) and
  ``enforce_nonce`` (discord.py sets it with any nonce): a post repeated after a 5xx that
  Discord returned AFTER creating the message (within Discord's window, a few minutes) gets
  the first message back instead of a second one; ``posted`` then edits it to the text wanted.
  A stream records the nonce of a post before making it (``NONCE_MARK`` in ``shown_parts``),
  so the next stream or the outbox send repeats that post with the same nonce.
- ``send_attachments``: private attachments (``dm_only``, or anything in a DM) go to the person
  by DM; if DMs are closed the channel is told how to open them; if the upload fails after the
  text said the files were coming, a follow-up says so plainly. Each upload message stays
  within ``limit`` bytes (``discord_attach.fit_uploads``: compressed or split, with a note).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import secrets

import aiohttp
import discord

from bot.domain import Attachment, Inbound, Reply
from bot.transports.discord_attach import fit_uploads
from bot.transports.discord_text import note_line

NO_MENTIONS = discord.AllowedMentions.none()
# Trouble reaching Discord, as opposed to Discord refusing us: worth another try later.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    discord.DiscordServerError,
)


def transient(exc: BaseException) -> bool:
    """Worth another try later: Discord unreachable or failing (5xx), or rate limited by a 429
    that discord.py did not wait out (no ``Via`` header: its edge limiting by IP)."""
    if isinstance(exc, discord.HTTPException) and exc.status == 429:
        return True
    return isinstance(exc, NETWORK_ERRORS)


DM_CLOSED = (
    "I could not send you a DM. Allow direct messages from server members (Privacy Settings) "
    "and try again."
)
NOT_SENT = (
    "Sorry, I could not send your files after all ({size} bytes; Discord said {why}). "
    "Ask the operator for a copy (meshsage export), or try again later."
)
Target = tuple[discord.abc.Messageable, discord.MessageReference | None]
NONCE_MARK = "nonce:"  # a shown_parts entry for a post made with this nonce, id not yet known


def part_nonce(key: str, part: int) -> str:
    """The nonce of part ``part`` of the answer ``key`` (Discord allows 25 characters)."""
    return "m" + hashlib.sha256(f"{key}:{part}".encode()).hexdigest()[:24]


def marked_nonces(shown: tuple[tuple[int, str], ...]) -> dict[int, str]:
    """Nonces of posts a stream made whose message id it never learnt (part -> nonce)."""
    return {p: v.removeprefix(NONCE_MARK) for p, v in shown if v.startswith(NONCE_MARK)}


def channel_space(guild_id: int, channel_id: int) -> str:
    return f"guild:{guild_id}:ch:{channel_id}"


def space_channel_id(space: str) -> int | None:
    """The channel id in a ``channel_space`` string; None for DMs and anything else."""
    parts = space.split(":")
    if len(parts) == 4 and parts[0] == "guild" and parts[2] == "ch" and parts[3].isdigit():
        return int(parts[3])
    return None


def describe(exc: BaseException) -> str:
    if isinstance(exc, discord.HTTPException):
        return f"HTTP {exc.status} (code {exc.code}): {exc.text or exc.__class__.__name__}"
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__


async def reply_target(
    client: discord.Client, inbound: Inbound, message: discord.Message | None
) -> Target:
    """Where to answer ``inbound`` (``message``: the inbound's Message, if remembered)."""
    if message is not None:
        return message.channel, message.to_reference(fail_if_not_exists=False)
    channel: discord.abc.Messageable
    if inbound.is_dm:
        dm = await client.create_dm(discord.Object(id=int(inbound.sender)))
        channel, channel_id = dm, dm.id
    else:
        found_id = space_channel_id(inbound.space)
        if found_id is None:
            raise discord.ClientException(f"not a Discord channel space: {inbound.space!r}")
        channel_id = found_id
        found = client.get_channel(channel_id)
        channel = (
            found
            if isinstance(found, discord.abc.Messageable)
            else client.get_partial_messageable(channel_id)
        )
    reference = None
    if inbound.message_id and inbound.message_id.isdigit():
        reference = discord.MessageReference(
            message_id=int(inbound.message_id), channel_id=channel_id, fail_if_not_exists=False
        )
    return channel, reference


async def post(
    channel: discord.abc.Messageable,
    content: str,
    reference: discord.MessageReference | None,
    nonce: str | None = None,
) -> discord.Message:
    """One text message, as a reply when ``reference`` is given; it can ping nobody. With a
    ``nonce`` a repeat of an earlier post returns that message (see ``posted``)."""
    once: str | int = secrets.randbits(64) if nonce is None else nonce  # discord.py's default
    if reference is None:
        msg = await channel.send(content, allowed_mentions=NO_MENTIONS, nonce=once)
    else:
        msg = await channel.send(
            content,
            reference=reference,
            mention_author=False,
            allowed_mentions=NO_MENTIONS,
            nonce=once,
        )
    return await posted(msg, content)


async def posted(msg: discord.Message, content: str) -> discord.Message:
    """``msg`` showing ``content``: a post Discord answered with an earlier message of the same
    nonce (it created nothing) still shows that message's old text; edit it. (Discord trims
    the whitespace around a message's content: that is not a difference.)"""
    if msg.content.strip() == content.strip():
        return msg
    return await msg.edit(content=content, allowed_mentions=NO_MENTIONS)


async def send_files(
    channel: discord.abc.Messageable, attachments: list[Attachment], *, limit: int
) -> list[discord.Message]:
    """Files in as many messages as Discord's count and size limits need."""
    batches, note = fit_uploads([(a.filename, a.data) for a in attachments], limit=limit)
    sent: list[discord.Message] = []
    for i, batch in enumerate(batches):
        files = [discord.File(io.BytesIO(data), filename=name) for name, data in batch]
        content = note_line(note) if note and i == 0 else None
        sent.append(await channel.send(content, files=files, allowed_mentions=NO_MENTIONS))
    return sent


async def send_attachments(
    client: discord.Client, reply: Reply, message: discord.Message | None, *, limit: int
) -> list[discord.Message]:
    """Private attachments go to the person's DMs; others follow the reply."""
    inbound = reply.inbound
    private = [a for a in reply.attachments if a.dm_only or inbound.is_dm]
    public = [a for a in reply.attachments if not (a.dm_only or inbound.is_dm)]
    sent: list[discord.Message] = []
    if private:
        user: discord.abc.Snowflake = (
            message.author if message is not None else discord.Object(id=int(inbound.sender))
        )
        try:
            dm = await client.create_dm(user)
            sent += await send_files(dm, private, limit=limit)
        except discord.Forbidden:
            if not inbound.is_dm:
                channel, reference = await reply_target(client, inbound, message)
                await post(channel, DM_CLOSED, reference)
            raise
        except discord.HTTPException as exc:
            # The text already said "on its way": tell the truth where it was said.
            channel, reference = await reply_target(client, inbound, message)
            size = sum(len(a.data) for a in private)
            await post(channel, NOT_SENT.format(size=size, why=describe(exc)), reference)
            raise
    if public:
        channel, _ = await reply_target(client, inbound, message)
        sent += await send_files(channel, public, limit=limit)
    return sent
