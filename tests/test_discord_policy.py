"""Who meshsage answers on Discord, and the login retry backoff: table tests of pure rules."""

from __future__ import annotations

import pytest

from bot.config import DiscordConfig
from bot.transports.discord_policy import Seen, admit, retry_delay

CH, THREAD, OTHER_CH = 100, 101, 200
OK = frozenset({10})
USER, BAD_USER = 1, 2
ROLE_OK, ROLE_BAD = 10, 11

BASE = DiscordConfig(channels=(CH,))
RESTRICTED = DiscordConfig(
    channels=(CH,),
    allowed_users=(USER, BAD_USER),
    blocked_users=(BAD_USER,),
    allowed_roles=(ROLE_OK,),
    blocked_roles=(ROLE_BAD,),
)


def guild(**kw: object) -> Seen:
    fields: dict[str, object] = {
        "author_id": USER,
        "author_is_bot": False,
        "is_dm": False,
        "channel_id": CH,
        "mentions_bot": True,
    }
    fields.update(kw)
    return Seen(**fields)  # type: ignore[arg-type]


def dm(**kw: object) -> Seen:
    return guild(is_dm=True, channel_id=999, mentions_bot=False, **kw)


@pytest.mark.parametrize(
    ("seen", "config", "reason"),
    [
        (dm(), BASE, None),
        (dm(), DiscordConfig(dms=False), "DMs disabled"),
        (dm(author_is_bot=True), BASE, "author is a bot"),
        (guild(), BASE, None),
        (guild(mentions_bot=False), BASE, "not addressed to the bot"),
        (guild(mentions_bot=False, replies_to_bot=True), BASE, None),
        (
            guild(mentions_bot=False, replies_to_bot=True),
            DiscordConfig(channels=(CH,), reply_trigger=False),
            "not addressed to the bot",
        ),
        (guild(channel_id=OTHER_CH), BASE, "channel not in channels"),
        (guild(channel_id=THREAD, parent_id=CH), BASE, None),
        (guild(), DiscordConfig(), "channel not in channels"),  # no channels: DMs only
        (guild(author_is_bot=True), BASE, "author is a bot"),
        (guild(role_ids=frozenset({ROLE_OK})), RESTRICTED, None),
        (guild(role_ids=frozenset()), RESTRICTED, "no role in allowed_roles"),
        (guild(role_ids=frozenset({ROLE_OK, ROLE_BAD})), RESTRICTED, "role blocked"),
        (guild(author_id=BAD_USER, role_ids=frozenset({ROLE_OK})), RESTRICTED, "user blocked"),
        (guild(author_id=3, role_ids=OK), RESTRICTED, "user not in allowed_users"),
        (dm(), RESTRICTED, None),  # role lists do not apply to DMs
        (dm(author_id=BAD_USER), RESTRICTED, "user blocked"),
    ],
)
def test_admit(seen: Seen, config: DiscordConfig, reason: str | None) -> None:
    assert admit(seen, config=config) == reason


def test_retry_delay_grows_with_jitter_and_caps() -> None:
    lows = [retry_delay(a, initial=2, cap=60, rand=0.0) for a in range(8)]
    highs = [retry_delay(a, initial=2, cap=60, rand=0.999) for a in range(8)]
    assert lows == [1, 2, 4, 8, 16, 30, 30, 30]
    assert all(lo < hi <= 2 * lo for lo, hi in zip(lows, highs, strict=True))
    assert retry_delay(10_000, initial=2, cap=60, rand=0.5) == 45
