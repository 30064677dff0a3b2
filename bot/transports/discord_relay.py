"""The Discord side of the bridge (``bot.bridge``): messages in paired channels out to the
bridge, mesh text in as posts, reactions and notices.

Invariants:
- Only guild messages in channels the bridge lists are handed over, DMs never; the bridge
  gets them with mentions rendered as names and ``from_bot`` set for bots, webhooks and the
  bot itself (so the relay's own posts never come back).
- Mesh text is posted through a channel webhook named ``WEBHOOK_NAME`` (the node's short name
  and id as the author) when ``relay.webhook`` is on and the bot may manage webhooks there;
  otherwise, or when that fails, as the bot's own message ``**<name>** (<node id>): text``.
  Nothing posted can ping anyone.
- Replies and reactions: a message replying to another in the same channel is handed over
  with ``reply_to``; unicode-emoji reactions in paired channels are handed over as
  ``DiscordReaction`` (custom emoji cannot be shown on the mesh and are not). A mesh reply
  posted as the bot is a Discord reply; through a webhook (which cannot reply) it opens with a
  quote line of the message it answers.
- Every call here returns normally on Discord trouble (logged); the bridge counts the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import discord

from bot.bridge import Bridge, DiscordReaction, DiscordText
from bot.transports.discord_attach import Incoming, kind
from bot.transports.discord_text import DISCORD_MAX_CHARS

log = logging.getLogger("bot.transport.discord")

WEBHOOK_NAME = "meshsage relay"
NO_MENTIONS = discord.AllowedMentions.none()
ERRORS: tuple[type[BaseException], ...] = (
    discord.HTTPException,
    discord.ClientException,
    OSError,
    TimeoutError,
)


class DiscordRelay:
    def __init__(
        self,
        *,
        client: Callable[[], discord.Client | None],
        channels: frozenset[int],
        webhook: bool,
    ) -> None:
        self._client = client
        self.channels = channels
        self._heard: Callable[[DiscordText], None] = lambda _msg: None
        self._reacted: Callable[[DiscordReaction], None] = lambda _r: None
        self._use_webhook = webhook
        self._webhooks: dict[int, discord.Webhook | None] = {}  # None: not permitted there

    def bind(self, bridge: Bridge) -> None:
        self._heard = bridge.discord_heard
        self._reacted = bridge.discord_reaction
        self.channels = bridge.discord_channels

    def offer(self, message: discord.Message, *, me: int, addressed: bool, text: str) -> None:
        """A guild message the transport received; handed to the bridge if its channel is
        paired. ``text`` is the message with mentions rendered as names."""
        if message.guild is None or message.channel.id not in self.channels:
            return
        author = message.author
        ref = message.reference
        self._heard(
            DiscordText(
                channel_id=message.channel.id,
                message_id=message.id,
                author_name=author.display_name,
                author_id=author.id,
                text=text,
                attachments=tuple(_kind(a) for a in message.attachments),
                from_bot=author.bot or author.id == me or message.webhook_id is not None,
                addressed=addressed,
                reply_to=(
                    ref.message_id
                    if ref is not None and ref.channel_id == message.channel.id
                    else None
                ),
            )
        )

    def offer_reaction(self, event: discord.RawReactionActionEvent, *, me: int) -> None:
        """A reaction added somewhere; handed to the bridge if its channel is paired."""
        if event.guild_id is None or event.channel_id not in self.channels:
            return
        if not event.emoji.is_unicode_emoji():
            return
        member = event.member
        self._reacted(
            DiscordReaction(
                channel_id=event.channel_id,
                message_id=event.message_id,
                emoji=event.emoji.name,
                user_id=event.user_id,
                from_bot=event.user_id == me or (member is not None and member.bot),
            )
        )

    async def relay_post(
        self,
        channel_id: int,
        *,
        name: str,
        node: str,
        text: str,
        reply_to: int | None = None,
        quote: str | None = None,
    ) -> int | None:
        client = self._client()
        if client is None or client.is_closed():
            return None
        channel = client.get_channel(channel_id)
        if not isinstance(channel, discord.TextChannel):
            log.warning("relay: Discord channel %s is not a text channel I can see", channel_id)
            return None
        hook = await self._webhook(channel) if self._use_webhook else None
        try:
            if hook is not None:
                if quote is not None:  # webhooks cannot reply: quote what this answers
                    text = f"> {discord.utils.escape_markdown(quote)}\n{text}"
                hooked = await hook.send(
                    _cap(text),
                    username=f"{name} ({node})"[:80],
                    allowed_mentions=NO_MENTIONS,
                    wait=True,
                )
                return hooked.id
            line = _cap(f"**{discord.utils.escape_markdown(name)}** ({node}): {text}")
            if reply_to is None:
                posted = await channel.send(line, allowed_mentions=NO_MENTIONS)
            else:
                ref = discord.MessageReference(
                    message_id=reply_to, channel_id=channel_id, fail_if_not_exists=False
                )
                posted = await channel.send(
                    line, allowed_mentions=NO_MENTIONS, reference=ref, mention_author=False
                )
        except ERRORS as exc:
            log.warning("relay: posting in %s failed: %s", channel_id, exc)
            return None
        return posted.id

    async def _webhook(self, channel: discord.TextChannel) -> discord.Webhook | None:
        if channel.id in self._webhooks:
            return self._webhooks[channel.id]
        hook: discord.Webhook | None = None
        try:
            for found in await channel.webhooks():
                if found.name == WEBHOOK_NAME and found.token:
                    hook = found
                    break
            if hook is None:
                hook = await channel.create_webhook(name=WEBHOOK_NAME)
        except discord.Forbidden:
            log.info("relay: no Manage Webhooks permission in %s; posting as the bot", channel.id)
            hook = None
        except ERRORS as exc:
            log.warning(
                "relay: webhook setup in %s failed (%s); posting as the bot", channel.id, exc
            )
            return None  # not cached: try again next time
        self._webhooks[channel.id] = hook
        return hook

    async def relay_react(self, channel_id: int, message_id: int, emoji: str) -> None:
        client = self._client()
        if client is None or client.is_closed():
            return
        try:
            await (
                client.get_partial_messageable(channel_id)
                .get_partial_message(message_id)
                .add_reaction(emoji)
            )
        except ERRORS as exc:
            log.debug("relay: reaction in %s failed: %s", channel_id, exc)

    async def relay_notice(self, channel_id: int, message_id: int, text: str) -> None:
        client = self._client()
        if client is None or client.is_closed():
            return
        channel = client.get_partial_messageable(channel_id)
        ref = discord.MessageReference(
            message_id=message_id, channel_id=channel_id, fail_if_not_exists=False
        )
        try:
            await channel.send(
                text, reference=ref, mention_author=False, allowed_mentions=NO_MENTIONS
            )
        except ERRORS as exc:
            log.warning("relay: notice in %s failed: %s", channel_id, exc)


def _kind(att: discord.Attachment) -> str:
    return (
        "image" if kind(Incoming(att.filename, att.content_type, att.size)) == "image" else "file"
    )


def _cap(text: str) -> str:
    return text if len(text) <= DISCORD_MAX_CHARS else text[: DISCORD_MAX_CHARS - 1] + "…"
