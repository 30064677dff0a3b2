"""Pure mesh rules: packet classification, triggers, dedup, cooldown, backoff, config keys."""

from __future__ import annotations

import asyncio
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import MeshtasticConfig
from bot.domain import DM_SPACE
from bot.errors import ConfigError, TransportError
from bot.transports.mesh_rules import (
    BROADCAST_NUM,
    Accepted,
    Backoff,
    Cooldown,
    Dedup,
    Dropped,
    ReceiveRules,
    classify,
    node_id,
    node_num,
    space_channel,
    strip_trigger,
)
from bot.transports.meshtastic import build_meshtastic, default_interface_factory
from bot.transports.meshtastic_link import _Worker

ME = 0x1234ABCD
ALICE = 0xA11CE001
RULES = ReceiveRules(
    channels=frozenset({0, 2}),
    mention="@meshsage",
    command_prefix="!",
    ignore_nodes=frozenset({0xB0B00002}),
)


def packet(text: Any = "hi", **top: Any) -> dict[str, Any]:
    decoded: dict[str, Any] = {"portnum": "TEXT_MESSAGE_APP", "payload": b""}
    if isinstance(text, bytes):
        decoded["payload"] = text
    elif text is not None:
        decoded.update(text=text, payload=text.encode())
    decoded.update(top.pop("decoded", {}))
    return {"from": ALICE, "to": ME, "id": 7, "decoded": decoded, **top}


@pytest.mark.parametrize(
    ("pkt", "reason"),
    [
        (packet(**{"from": ME}), "our own packet"),
        (packet(viaMqtt=True), "relayed from MQTT"),
        ({"from": ALICE, "to": ME, "id": 1, "encrypted": "3q2+7w=="}, "could not decrypt"),
        (packet(decoded={"portnum": "POSITION_APP"}), "not text"),
        (packet("👍", decoded={"emoji": 1}), "tapback reaction"),
        (packet(**{"from": 0xB0B00002}), "ignored node"),
        (packet("   "), "empty text"),
        (packet(b"\xff\xfe", to=BROADCAST_NUM), "invalid UTF-8"),
        (packet("(2/3) chunk of another bot"), "loop guard"),
        (packet(to=0x0DDBA11), "addressed to another node"),
        (packet("@meshsage hi", to=BROADCAST_NUM, channel=1), "channel 1 not enabled"),
        (packet("hello all", to=BROADCAST_NUM), "no trigger"),
        (packet("@meshsage", to=BROADCAST_NUM), "trigger without a question"),
        ({"to": ME, "decoded": {}}, "no sender"),
    ],
)
def test_dropped(pkt: dict[str, Any], reason: str) -> None:
    verdict = classify(pkt, my_num=ME, rules=RULES)
    assert isinstance(verdict, Dropped) and reason in verdict.reason


def test_dm_accepted_with_sender_from_numeric_from() -> None:
    verdict = classify(packet(" hi there ", fromId=None), my_num=ME, rules=RULES)
    assert verdict == Accepted("!a11ce001", ALICE, "hi there", DM_SPACE, 0, 7, None)


def test_channel_trigger_accepted_and_stripped() -> None:
    pkt = packet("hey @MESHSAGE, how far?", to=BROADCAST_NUM, channel=2, decoded={"replyId": 5})
    verdict = classify(pkt, my_num=ME, rules=RULES)
    assert isinstance(verdict, Accepted)
    assert (verdict.text, verdict.space, verdict.reply_to) == ("hey how far?", "ch2", 5)


def test_a_dm_of_only_invalid_utf8_is_handed_on_to_be_answered() -> None:
    """Issue 28: it was dropped with no reply (a NUL-only DM got "Your message was empty")."""
    verdict = classify(packet(b"\xff\xfe"), my_num=ME, rules=RULES)
    assert isinstance(verdict, Accepted) and verdict.repaired_utf8
    assert set(verdict.text) == {"\ufffd"}


def test_repaired_utf8_is_accepted_and_flagged() -> None:
    verdict = classify(packet(b"caf\xc3 ok"), my_num=ME, rules=RULES)
    assert (
        isinstance(verdict, Accepted) and verdict.repaired_utf8 and verdict.text == "caf\ufffd ok"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@meshsage what time is it", "what time is it"),
        ("what time is it @meshsage?", "what time is it"),
        ("!reset", "!reset"),
        ("!", None),
        ("mail bob@meshsage.org", None),
        ("@meshsagex hi", None),
        ("plain", None),
        ("!ping", None),  # another bot's command
        ("!!! storm warning", None),
        ("!HELP", "!HELP"),
    ],
)
def test_strip_trigger(text: str, expected: str | None) -> None:
    known = frozenset({"reset", "help"})
    assert strip_trigger(text, mention="@meshsage", command_prefix="!", commands=known) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("meshsage: what time is it", "what time is it"),
        ("Meshsage what time", "what time"),
        ("I asked meshsage yesterday", None),  # the name mid-sentence
        ("meshsagely", None),
    ],
)
def test_a_plain_word_trigger_counts_only_as_the_first_word(
    text: str, expected: str | None
) -> None:
    assert strip_trigger(text, mention="meshsage", command_prefix=None) == expected


def test_node_ids_and_spaces() -> None:
    assert node_id(0x5EC12E7) == "!05ec12e7" and node_num("!05EC12E7") == 0x5EC12E7
    with pytest.raises(ValueError):
        node_num("bob")  # would hit the library's sys.exit trap as a destination
    assert space_channel("ch3") == 3 and space_channel(DM_SPACE) is None


def test_dedup_by_identity_not_by_text() -> None:
    d = Dedup(window=60)
    assert not d.is_duplicate(sender=1, packet_id=10, now=0)
    assert d.is_duplicate(sender=1, packet_id=10, now=1)  # a rebroadcast or MQTT copy
    assert not d.is_duplicate(sender=1, packet_id=11, now=2)  # same words, new packet: new
    assert not d.is_duplicate(sender=2, packet_id=10, now=3)  # someone else's id
    assert not d.is_duplicate(sender=1, packet_id=10, now=61)  # window passed
    assert not d.is_duplicate(sender=1, packet_id=0, now=62)  # no id: never a copy


def test_cooldown() -> None:
    c = Cooldown(seconds=15)
    assert c.ready_at("a") == float("-inf")
    c.note("a", 100)
    assert c.ready_at("a") == 115


def test_backoff_doubles_to_the_cap_with_jitter_and_resets() -> None:
    b = Backoff(initial=5, maximum=300, rng=random.Random(3))
    delays = [b.next() for _ in range(10)]
    bases = [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]
    for d, base in zip(delays, bases, strict=True):
        assert 0.8 * base <= d <= min(300, 1.2 * base)
    assert delays[7] != delays[8]  # jitter: restarts of many bots do not synchronise
    b.reset()
    assert 4 <= b.next() <= 6


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="spacing_seconds"):
        MeshtasticConfig.model_validate({"spacing_seconds": 2.0})
    with pytest.raises(ValueError, match="channel index 8"):
        MeshtasticConfig.model_validate({"channels": [8]})
    with pytest.raises(ValueError, match="node id"):
        MeshtasticConfig.model_validate({"ignore_nodes": ["bob"]})
    with pytest.raises(ValueError, match="reconnect_initial"):
        MeshtasticConfig.model_validate({"reconnect_initial": 600, "reconnect_max": 300})
    with pytest.raises(ValueError, match="extra"):
        MeshtasticConfig.model_validate({"spaceing": 3})
    cfg = MeshtasticConfig.model_validate({"ignore_nodes": ["B0B00002"], "channels": [2, 0, 2]})
    assert cfg.ignore_nodes == ("!b0b00002",) and cfg.channels == (0, 2)


@pytest.mark.parametrize(
    ("settings", "needed"),
    [({}, "device"), ({"connection": "tcp"}, "host"), ({"connection": "ble"}, "address")],
)
def test_missing_link_settings_fail_at_build(settings: dict[str, Any], needed: str) -> None:
    cfg = MeshtasticConfig.model_validate(settings)
    with pytest.raises(ConfigError, match=f"needs '{needed}'"):
        build_meshtastic(cfg, bot_name="b", command_prefix="!")


async def test_tcp_factory_fails_fast_when_nothing_listens() -> None:
    cfg = MeshtasticConfig.model_validate({"connection": "tcp", "host": "127.0.0.1", "port": 9})
    with pytest.raises(OSError):
        await asyncio.to_thread(default_interface_factory(cfg))


def test_limits_tell_the_model_the_byte_budget() -> None:
    cfg = MeshtasticConfig.model_validate({"device": "/dev/null", "max_parts": 2})
    t = build_meshtastic(cfg, bot_name="b", command_prefix="!")
    assert (t.limits.context_tokens, t.limits.max_tokens) == (1536, 120)
    assert "200 bytes" in t.limits.style_hint and "400 bytes" in t.limits.style_hint
    assert t.fit("x " * 500).endswith(" … (!more)")


async def test_worker_turns_sys_exit_into_an_error_and_survives() -> None:
    worker = _Worker("test-io")

    def trap() -> None:
        raise SystemExit("Warning: NodeId bob not found in DB")

    with pytest.raises(TransportError, match="refused"):
        await worker.call(trap, timeout=5)
    assert await worker.call(lambda: 42, timeout=5) == 42
    with pytest.raises(TimeoutError):
        await worker.call(lambda: time.sleep(0.3), timeout=0.01)
    worker.shutdown()


def _example_meshtastic_block() -> str:
    """The commented-out ``meshtastic:`` section of config.example.yaml, uncommented."""
    example = (Path(__file__).parent.parent / "config.example.yaml").read_text(encoding="utf-8")
    lines = example.splitlines()
    start = lines.index("# meshtastic:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(block)


def test_example_documents_every_meshtastic_key_in_its_own_section() -> None:
    section = yaml.safe_load(_example_meshtastic_block())["meshtastic"]
    fields = set(MeshtasticConfig.model_fields)
    commented = {  # optional keys shown commented out inside the section ("#   # trigger: ...")
        m.group(1)
        for m in re.finditer(r"^  # ([a-z_]+): \S", _example_meshtastic_block(), re.MULTILINE)
    }
    assert set(section) - fields == set()  # no stale key in the example
    assert sorted(fields - set(section) - commented) == []  # no undocumented key
    MeshtasticConfig.model_validate(section)  # the documented values are valid together


def test_ble_factory_passes_address_and_closes_a_half_built_interface(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No BLE hardware or BlueZ here: the library class is stubbed (nothing real can run)."""
    from meshtastic.ble_interface import BLEInterface
    from meshtastic.mesh_interface import MeshInterface

    calls: list[tuple[str, Any]] = []

    def init(self: Any, address: str, timeout: int = 300) -> None:
        calls.append(("init", (address, timeout)))
        if address == "AA:BB:CC:DD:EE:00":
            raise MeshInterface.MeshInterfaceError("Timed out waiting for connection completion")

    monkeypatch.setattr(BLEInterface, "__init__", init)
    monkeypatch.setattr(BLEInterface, "close", lambda self: calls.append(("close", self)))
    cfg = MeshtasticConfig.model_validate(
        {"connection": "ble", "address": "AA:BB:CC:DD:EE:FF", "connect_timeout": 42}
    )
    iface = default_interface_factory(cfg)()
    assert isinstance(iface, BLEInterface) and calls == [("init", ("AA:BB:CC:DD:EE:FF", 42))]
    calls.clear()
    broken = cfg.model_copy(update={"address": "AA:BB:CC:DD:EE:00"})
    with pytest.raises(TransportError, match="bluetoothctl") as failed:  # the cause and the fix
        default_interface_factory(broken)()
    assert isinstance(failed.value.__cause__, MeshInterface.MeshInterfaceError)
    assert [c[0] for c in calls] == ["init", "close"]  # BlueZ is not left connected
