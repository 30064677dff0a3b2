"""MeshCore identity: a DM's sender is its public key; channel texts never identify anyone."""

from __future__ import annotations

import pytest

from bot.config import Config
from bot.domain import DM_SPACE, Inbound
from bot.transports.meshcore_rules import Rules, classify_channel, classify_dm
from bot.trust import SenderPolicy

KEY = "3f2a9c01b7de" + "ab" * 26
OTHER = "3f2a9c01b7de" + "cd" * 26
RULES = Rules(channels=frozenset({0}), mention="@meshsage", command_prefix="!")


def _dm(prefix: str = KEY[:12], text: str = "hi", **extra: object) -> dict[str, object]:
    return {"pubkey_prefix": prefix, "txt_type": 0, "sender_timestamp": 100, "text": text, **extra}


def test_a_dm_resolved_to_one_contact_is_that_key_authenticated() -> None:
    got = classify_dm(_dm(), rules=RULES, resolve=lambda p: ((KEY, "Alice"),))
    assert got.sender == KEY and got.authenticated and got.name == "Alice"  # type: ignore[union-attr]


@pytest.mark.parametrize("contacts", [(), ((KEY, "Alice"), (OTHER, "Mallory"))])
def test_an_unknown_or_ambiguous_prefix_is_not_an_identity(
    contacts: tuple[tuple[str, str], ...],
) -> None:
    got = classify_dm(_dm(), rules=RULES, resolve=lambda p: contacts)
    assert got.sender == KEY[:12] and not got.authenticated  # type: ignore[union-attr]


def test_a_channel_name_is_never_an_identity_and_never_a_key() -> None:
    payload = {
        "channel_idx": 0,
        "txt_type": 0,
        "sender_timestamp": 1,
        "text": f"{KEY}: @meshsage hi",
    }
    got = classify_channel(payload, rules=RULES, own_name="meshsage")
    assert not got.authenticated and got.sender == "~" + KEY  # type: ignore[union-attr]


@pytest.mark.parametrize(("txt_type", "reason"), [(1, "not plain text"), (2, "not plain text")])
def test_cli_data_and_signed_room_posts_are_not_questions(txt_type: int, reason: str) -> None:
    got = classify_dm(_dm(txt_type=txt_type), rules=RULES, resolve=lambda p: ((KEY, "A"),))
    assert reason in got.reason  # type: ignore[union-attr]


def _inbound(sender: str, *, authenticated: bool, space: str = DM_SPACE) -> Inbound:
    return Inbound(
        transport="meshcore", sender=sender, text="!stats", space=space,
        authenticated=authenticated,
    )  # fmt: skip


def test_operators_are_listed_by_key_or_prefix_and_need_the_authenticated_dm() -> None:
    config = Config.model_validate({"bot": {"operators": [f"meshcore:{KEY[:12].upper()}"]}})
    policy = SenderPolicy(operators=frozenset(config.bot.operators))
    assert policy.is_operator(_inbound(KEY, authenticated=True))
    assert policy.is_operator(_inbound(OTHER, authenticated=True))  # shares the listed prefix
    assert not policy.is_operator(_inbound(KEY[:12], authenticated=False))
    assert not policy.is_operator(_inbound("~" + KEY, authenticated=False, space="ch0"))
    full = SenderPolicy(operators=frozenset({f"meshcore:{KEY}"}))
    assert full.is_operator(_inbound(KEY, authenticated=True))
    assert not full.is_operator(_inbound(OTHER, authenticated=True))


@pytest.mark.parametrize("bad", ["meshcore:alice", "meshcore:3f2a", "meshcore:3f2a9c01b7dz"])
def test_a_meshcore_operator_must_be_a_key(bad: str) -> None:
    with pytest.raises(ValueError, match="public key in hex"):
        Config.model_validate({"bot": {"operators": [bad]}})


def test_refusals_say_what_proves_a_meshcore_sender() -> None:
    forget = Inbound(transport="meshcore", sender=KEY[:12], text="!forget")
    why = SenderPolicy().refusal(forget, "forget", prefix="!", operator_commands=())
    assert why is not None and "key" in why and len(why.encode()) <= 158
