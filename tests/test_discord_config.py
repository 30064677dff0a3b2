"""The discord: config section: documented keys validate, unknown or bad ones are rejected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bot.config import Config, DiscordConfig, load_config
from bot.errors import ConfigError

EXAMPLE = Path(__file__).parent.parent / "config.example.yaml"


def test_documented_section_validates_with_defaults() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    section = text[text.index("# discord:") :]
    lines = [re.sub(r"^# ?", "", line) for line in section.splitlines()]
    raw = yaml.safe_load("\n".join(x for x in lines if not x.lstrip().startswith("#")))
    assert sorted(raw["discord"]) == sorted(DiscordConfig.model_fields), "every key documented"
    config = Config.model_validate(raw)
    assert config.discord is not None
    assert config.discord == Config.model_validate({"discord": {}}).discord
    assert config.enabled_transports() == ["discord"]


def test_ids_may_be_quoted(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text('discord:\n  channels: ["123456789012345678", 42]\n', encoding="utf-8")
    config = load_config(path, env={})
    assert config.discord is not None and config.discord.channels == (123456789012345678, 42)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("discord:\n  channel: [1]\n", "discord.channel: unknown key. Fix: did you mean 'chan"),
        ("discord:\n  channels: [-5]\n", "discord.channels.0"),
        ("discord:\n  token_env: my token\n", "discord.token_env"),
        ("discord:\n  max_parts: 0\n", "discord.max_parts"),
    ],
)
def test_bad_keys_rejected_with_the_file_and_key(tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert str(path) in str(err.value) and needle in str(err.value)


def test_documented_invite_link_asks_for_exactly_the_needed_permissions() -> None:
    import discord

    doc = (Path(__file__).parent.parent / "docs" / "discord.md").read_text(encoding="utf-8")
    [asked] = re.findall(r"scope=bot\+applications.commands&permissions=(\d+)", doc)
    needed = discord.Permissions(
        view_channel=True,
        send_messages=True,
        send_messages_in_threads=True,
        read_message_history=True,  # replies reference the message they answer
    )
    assert discord.Permissions(int(asked)) == needed


def test_documented_relay_section_validates_with_defaults() -> None:
    from bot.config import RelayConfig

    text = EXAMPLE.read_text(encoding="utf-8")
    section = text[text.index("# relay:") :]
    lines = [re.sub(r"^# ?", "", line) for line in section.splitlines()]
    raw = yaml.safe_load("\n".join(x for x in lines if not x.lstrip().startswith("#")))
    assert sorted(raw["relay"]) == sorted(RelayConfig.model_fields), "every key documented"
    relay = Config.model_validate(raw).relay
    [pair] = relay.pairs
    assert (pair.mesh_channel, pair.direction) == (0, "both")
    assert relay.model_copy(update={"pairs": ()}) == RelayConfig()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("relay:\n  pairs:\n    - {mesh_channel: 8, discord_channel: 5}\n", "mesh_channel"),
        (
            "relay:\n  pairs:\n    - {mesh_channel: 0, discord_channel: 5, direction: up}\n",
            "direction",
        ),
        ("relay:\n  pair: []\n", "relay.pair: unknown key"),
    ],
)
def test_bad_relay_config_is_rejected(tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert needle in str(err.value)
