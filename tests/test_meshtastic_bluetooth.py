"""Meshtastic over Bluetooth LE (issue 42): our transport, its real interface factory and the
unmodified ``BLEInterface`` (with ``BLEClient``'s event-loop thread) against a fake node at
bleak's seam (``tests/fakes/fake_ble.py``): connect, receive, send and reconnect after the link
is lost; and a failed start (no BlueZ, no adapter, an unpaired node, a wrong address form)
names the cause and the fix in the log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import MeshtasticConfig
from bot.domain import DeliveryStatus, Inbound, Reply
from bot.ops.doctor import Level
from bot.ops.doctor_ble import check_ble
from bot.transports.meshtastic import MeshtasticTransport, build_meshtastic
from bot.transports.meshtastic_ble import address_problem, ble_failure
from tests.fakes.fake_ble import ADDRESS, FakeBleRadio, install
from tests.fakes.mesh_harness import FAST


async def _until(cond: Callable[[], bool], what: str, tries: int = 3000) -> None:
    for _ in range(tries):  # a hang guard, not a timing assertion
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def _transport(address: str = ADDRESS, **over: Any) -> MeshtasticTransport:
    settings = {**FAST, "reconnect_initial": 0.05, "reconnect_max": 0.2, **over}
    config = MeshtasticConfig.model_validate({**settings, "connection": "ble", "address": address})
    t = build_meshtastic(config, bot_name="meshsage", command_prefix="!")  # the real factory
    assert isinstance(t, MeshtasticTransport)
    return t


@pytest.fixture
def radio(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBleRadio]:
    node = FakeBleRadio()
    install(monkeypatch, node)
    yield node
    node.drop()


async def test_bluetooth_connect_receive_send_and_reconnect(radio: FakeBleRadio) -> None:
    transport = _transport()
    inbox: list[Inbound] = []

    async def on_message(inbound: Inbound) -> None:
        inbox.append(inbound)

    await transport.start(on_message)
    try:
        await _until(lambda: transport._up.is_set(), "BLE link up")
        assert radio.clients == 1 and radio.client is not None
        radio.inject_text("hello over bluetooth")
        await _until(lambda: len(inbox) == 1, "a message over BLE")
        assert inbox[0].text == "hello over bluetooth" and inbox[0].transport == "meshtastic"
        delivery = await transport.send(Reply(inbound=inbox[0], text=transport.fit("hi back")))
        assert delivery.status is DeliveryStatus.DELIVERED, delivery  # the mesh ACK came back
        assert radio.texts() == ["hi back"]

        radio.drop()  # out of range: bleak's disconnected callback, as from BlueZ
        await _until(lambda: transport._generation >= 2, "reconnected over BLE")
        assert radio.clients == 2
        radio.inject_text("back in range")
        await _until(lambda: len(inbox) == 2, "a message after the reconnect")
        assert inbox[1].text == "back in range"
        delivery = await transport.send(Reply(inbound=inbox[1], text=transport.fit("still here")))
        assert delivery.status is DeliveryStatus.DELIVERED and radio.texts() == [
            "hi back",
            "still here",
        ]
    finally:
        await transport.stop()
    assert radio.client is None  # stop released the node's one BLE connection


@pytest.mark.parametrize(
    ("case", "address", "words"),
    [
        ("not paired", ADDRESS, ["not paired", "bluetoothctl", f"pair {ADDRESS}", "trust"]),
        ("no adapter", ADDRESS, ["no Bluetooth adapter", "bluetoothctl power on"]),
        ("lowercase", ADDRESS.lower(), ["not in the form BlueZ reports", ADDRESS]),
        ("node id", "!1234abcd", ["node id, not a Bluetooth address", "AA:BB:CC:DD:EE:FF"]),
        ("absent", "F0:9E:9E:00:00:01", ["was seen in a 10 s scan", "bluetoothctl devices"]),
    ],
)
async def test_bluetooth_failed_start_names_cause_and_fix(
    radio: FakeBleRadio,
    caplog: pytest.LogCaptureFixture,
    case: str,
    address: str,
    words: list[str],
) -> None:
    radio.paired = case != "not paired"
    radio.adapter = case != "no adapter"
    transport = _transport(address)

    async def on_message(inbound: Inbound) -> None:
        raise AssertionError("nothing arrives")

    with caplog.at_level(logging.WARNING, logger="bot.transport.meshtastic"):
        await transport.start(on_message)
        try:
            await _until(lambda: "radio not reachable" in caplog.text, "the warning")
        finally:
            await transport.stop()
    line = next(r.getMessage() for r in caplog.records if "radio not reachable" in r.getMessage())
    for word in words:
        assert word in line, (case, line)
    assert not transport._up.is_set()
    await _until(lambda: radio.client is None, "the node released")  # BlueZ holds nothing


def test_bluetooth_without_bluez_says_install_it() -> None:
    # What the real bleak raises on a machine with no D-Bus system bus (this one).
    said = ble_failure(FileNotFoundError(2, "No such file or directory"), ADDRESS)
    assert "BlueZ is not reachable" in said and "systemctl enable --now bluetooth" in said


def test_bluetooth_address_forms() -> None:
    assert address_problem(ADDRESS) is None and address_problem("Meshtastic_abcd") is None
    assert "F0:9E:9E:12:AB:CD" in (address_problem("f0-9e-9e-12-ab-cd") or "")
    assert "not set" in (address_problem(None) or "")


def _ble_config(address: str | None = ADDRESS) -> MeshtasticConfig:
    return MeshtasticConfig.model_validate({"connection": "ble", "address": address or "x"})


def _bluetoothctl(tmp_path: Path, out: str) -> str:
    tool = tmp_path / "bluetoothctl"
    tool.write_text(f"#!/bin/sh\n[ \"$1\" = info ] && [ \"$2\" = {ADDRESS} ] || exit 1\n"
                    f"cat <<'X'\n{out}\nX\n")  # fmt: skip
    tool.chmod(0o755)
    return str(tool)


@pytest.mark.parametrize(
    ("case", "want", "words"),
    [
        ("paired", Level.OK, ["adapter hci0", "is paired"]),
        ("unpaired", Level.FAIL, ["is not paired", f"pair {ADDRESS}", "trust"]),
        ("no adapter", Level.FAIL, ["no Bluetooth adapter", "bluetoothctl power on"]),
        ("no bluez", Level.FAIL, ["bluetoothctl is missing", "apt install bluez"]),
        ("lowercase", Level.FAIL, ["not in the form BlueZ reports", ADDRESS]),
    ],
)
async def test_bluetooth_doctor_names_cause_and_fix(
    tmp_path: Path, case: str, want: Level, words: list[str]
) -> None:
    sysfs = tmp_path / "sys"
    (sysfs / "hci0").mkdir(parents=True)
    if case == "no adapter":
        (sysfs / "hci0").rmdir()
    tool = _bluetoothctl(
        tmp_path, f"Device {ADDRESS}\n\tPaired: {'yes' if case == 'paired' else 'no'}"
    )
    cfg = _ble_config(ADDRESS.lower() if case == "lowercase" else ADDRESS)
    check = await check_ble(cfg, sysfs=sysfs, which=lambda _: None if case == "no bluez" else tool)
    assert check.level is want, check
    for word in words:
        assert word in check.line(), (case, check.line())
