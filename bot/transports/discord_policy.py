"""Which Discord messages meshsage answers, and how long to wait between login attempts.
Pure functions over plain values; no discord import (the adapter extracts a ``Seen``).

Invariants:
- Bots (the bot itself included) and webhooks are never answered: no loops between bots.
- Block lists win over allow lists; an empty allow list allows everyone.
- ``allowed_users``/``blocked_users`` apply everywhere; role lists apply in guilds only (a DM
  carries no roles).
- DMs are answered when ``dms`` is on. In a guild a message is answered only in a listed
  channel (a thread counts as its parent channel) and only when it @mentions the bot (or the
  bot's managed role), or, with ``reply_trigger``, replies to one of the bot's messages, or is
  in a thread the bot follows. An @everyone/@here does not address the bot.
- ``retry_delay`` grows exponentially from ``initial`` to ``cap`` with jitter in [base/2, base],
  so many bots restarted together do not hammer the gateway in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.config import DiscordConfig


@dataclass(frozen=True, slots=True)
class Seen:
    """The facts about one Discord message that decide whether it is for us."""

    author_id: int
    author_is_bot: bool  # bot accounts, the bot itself, webhooks and system messages
    is_dm: bool
    channel_id: int
    parent_id: int | None = None  # a thread's parent channel
    role_ids: frozenset[int] = frozenset()
    mentions_bot: bool = False
    replies_to_bot: bool = False
    followed: bool = False  # a thread the bot follows (``follow_threads``): no mention needed


def admit(seen: Seen, *, config: DiscordConfig) -> str | None:
    """None when the message is for us, else the reason it is ignored (for debug logs)."""
    if seen.author_is_bot:
        return "author is a bot"
    if seen.author_id in config.blocked_users:
        return "user blocked"
    if config.allowed_users and seen.author_id not in config.allowed_users:
        return "user not in allowed_users"
    if seen.is_dm:
        return None if config.dms else "DMs disabled"
    if seen.channel_id not in config.channels and seen.parent_id not in config.channels:
        return "channel not in channels"
    if seen.role_ids & set(config.blocked_roles):
        return "role blocked"
    if config.allowed_roles and not seen.role_ids & set(config.allowed_roles):
        return "no role in allowed_roles"
    if seen.mentions_bot or seen.followed or (config.reply_trigger and seen.replies_to_bot):
        return None
    return NOT_ADDRESSED


NOT_ADDRESSED = "not addressed to the bot"


def retry_delay(attempt: int, *, initial: float, cap: float, rand: float) -> float:
    """Seconds to wait before login attempt ``attempt + 1``; ``rand`` is uniform in [0, 1)."""
    base = min(cap, initial * 2.0 ** min(attempt, 30))
    return base / 2 + base / 2 * rand
