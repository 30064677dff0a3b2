"""Which Discord messages the bot answers, and the ``Inbound`` each one becomes.

Invariants:
- Who is answered is decided by ``discord_policy.admit`` (bots and webhooks never; DMs when
  enabled; in guilds only listed channels, and only when the bot is @mentioned or a reply to
  one of its messages). The mention is stripped. A DM is decided by the channel type, never by
  a missing guild (an uncached guild's message is ignored, not answered as a DM).
- sender = the author's id; space = ``DM_SPACE`` for DMs, else ``guild:<guild id>:ch:<channel
  id>`` (one conversation per person per channel: nothing said in a DM reaches a channel).
- A message already handled (``handled``) is not handed on again.
- ``OwnMessages`` remembers the bot's recent messages (bounded): a reply to any part of a
  multi-part answer continues the answer's first message (the id it is stored under), and a
  quoted answer says whom it was for when that is known (else it is quoted, the safe side).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container

import discord

from bot.config import DiscordConfig
from bot.domain import DM_SPACE, Inbound
from bot.transports.discord_policy import NOT_ADDRESSED, Seen, admit
from bot.transports.discord_read import is_dm as dm_channel
from bot.transports.discord_read import quote as quote_of
from bot.transports.discord_read import readable_text
from bot.transports.discord_send import channel_space
from bot.transports.discord_text import speaker, strip_mentions

log = logging.getLogger("bot.transport.discord")

NAME = "discord"


class OwnMessages:
    """The bot's recent messages: each one's answer head, and whom each answer was for."""

    def __init__(self, *, limit: int) -> None:
        self._limit = limit
        # id of each message the bot sent -> id of the first message of the same answer
        self._own: OrderedDict[int, int] = OrderedDict()
        # id of the first message of an answer -> the id of the person it answered
        self._answered: OrderedDict[int, int] = OrderedDict()

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._own

    def remember(self, message_id: int, *, head: int | None = None) -> None:
        self._own[message_id] = message_id if head is None else head
        while len(self._own) > self._limit:
            self._own.popitem(last=False)

    def answered(self, head: int, person: str) -> None:
        """The answer whose first message is ``head`` was for ``person`` (a Discord id)."""
        if person.isdigit():
            self._answered[head] = int(person)
            while len(self._answered) > self._limit:
                self._answered.popitem(last=False)

    def answered_to(self, message_id: int) -> int | None:
        """Whom the answer containing our message ``message_id`` was for (None: unknown)."""
        head = self._own.get(message_id)
        return None if head is None else self._answered.get(head)

    def thread_parent(self, ref: discord.MessageReference | None) -> str | None:
        """The id a reply continues. A reply to any part of a multi-part answer points at the
        answer's first message, the id under which the answer is stored."""
        if ref is None or ref.message_id is None:
            return None
        return str(self._own.get(ref.message_id, ref.message_id))


def to_inbound(
    message: discord.Message,
    *,
    me: discord.ClientUser | None,
    config: DiscordConfig,
    mine: OwnMessages,
    handled: Container[str],
    edit: bool = False,
    followed: bool = False,
) -> Inbound | None:
    """The ``Inbound`` for a message the bot answers, or None (logged at DEBUG, with why).
    ``edit``: the message was edited; one that no longer addresses the bot (its mention
    removed) still becomes an ``edit_only`` inbound, so what is stored follows the edit."""
    if me is None:
        return None
    author = message.author
    guild = message.guild
    channel = message.channel
    # A DM is decided by the channel type, never by ``guild is None``: a message from a
    # guild discord.py has not cached (yet) has no guild either, and must not be taken for
    # a DM (answered unaddressed, from the author's DM memory, into a guild channel).
    is_dm = dm_channel(channel)
    if not is_dm and guild is None:
        log.debug("ignoring Discord message %s: its guild is not cached", message.id)
        return None
    bot_roles = [
        role.id
        for role in message.role_mentions
        if role.tags is not None and role.tags.bot_id == me.id
    ]
    ref = message.reference
    resolved = ref.resolved if ref is not None else None
    replies_to_bot = ref is not None and (
        (isinstance(resolved, discord.Message) and resolved.author.id == me.id)
        or (ref.message_id is not None and ref.message_id in mine)
    )
    seen = Seen(
        author_id=author.id,
        author_is_bot=(
            author.bot
            or author.id == me.id
            or message.webhook_id is not None
            or message.type not in (discord.MessageType.default, discord.MessageType.reply)
        ),
        is_dm=is_dm,
        channel_id=channel.id,
        parent_id=channel.parent_id if isinstance(channel, discord.Thread) else None,
        role_ids=frozenset(r.id for r in getattr(author, "roles", ())),
        mentions_bot=any(u.id == me.id for u in message.mentions) or bool(bot_roles),
        replies_to_bot=replies_to_bot,
        followed=followed and isinstance(channel, discord.Thread),
    )
    reason = admit(seen, config=config)
    edit_only = edit and reason == NOT_ADDRESSED
    if edit_only:
        reason = None
    if reason is not None:
        log.debug("ignoring Discord message %s: %s", message.id, reason)
        return None
    if str(message.id) in handled:
        log.debug("ignoring Discord message %s: already handled", message.id)
        return None
    text = readable_text(
        message, strip_mentions(message.content, user_ids=[me.id], role_ids=bot_roles)
    )
    # A reply without a ping arrives empty when the message content intent is off; a
    # sticker or an embed alone is no question: neither is announced as "empty".
    if (
        not text
        and not message.attachments
        and not is_dm
        and (not seen.mentions_bot or message.stickers or message.embeds or edit)
    ):
        log.debug("ignoring Discord message %s: no content", message.id)
        return None
    if isinstance(resolved, discord.Message) and not is_dm:
        quote = quote_of(resolved, asker=author.id, me=me.id, answered_to=mine.answered_to)
        if quote:
            text = f"{quote}\n\n{text}".strip()
    return Inbound(
        transport=NAME,
        sender=str(author.id),
        text=text,
        space=DM_SPACE if is_dm or guild is None else channel_space(guild.id, channel.id),
        message_id=str(message.id),
        reply_to=mine.thread_parent(ref),
        sender_name=author.display_name if is_dm else speaker(author.display_name, author.id),
        received_at=message.created_at,
        edited=edit,
        edit_only=edit_only,
        authenticated=True,  # Discord's login: the author id is that account (bot.trust)
    )
