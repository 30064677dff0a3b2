"""The fake radio's suite-wide on-air guard fails when it should (a guard that cannot fail
would make every transport test's "<= 200 bytes, >= spacing" claim hollow)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from meshtastic.protobuf import mesh_pb2

from tests.fakes.fake_radio import ALICE, TEXT_PORT, FakeTcpRadio, check_on_air, frame


class _Clock:
    now = 0.0

    def monotonic(self) -> float:
        return self.now


def _air(radio: FakeTcpRadio, clock: _Clock, at: float, text: bytes) -> None:
    """The radio reads one text packet from its client at ``at``."""
    clock.now = at
    tr = mesh_pb2.ToRadio()
    tr.packet.to = ALICE
    tr.packet.decoded.portnum = TEXT_PORT
    tr.packet.decoded.payload = text
    radio._feed(frame(tr))


@pytest.fixture
def radio() -> Iterator[tuple[FakeTcpRadio, _Clock]]:
    clock = _Clock()
    r = FakeTcpRadio(clock=clock)
    yield r, clock
    r.on_air.clear()  # the violations were on purpose; keep the autouse guard quiet
    r.stop()


def test_guard_rejects_a_201_byte_text(radio: tuple[FakeTcpRadio, _Clock]) -> None:
    r, clock = radio
    _air(r, clock, 0.0, b"x" * 200)
    check_on_air(r)
    _air(r, clock, 10.0, "é".encode() * 100 + b"x")
    with pytest.raises(AssertionError, match="201-byte text"):
        check_on_air(r)


def test_guard_rejects_texts_closer_than_the_spacing(radio: tuple[FakeTcpRadio, _Clock]) -> None:
    r, clock = radio
    _air(r, clock, 0.0, b"one")
    _air(r, clock, 2.1, b"two")  # the firmware floor is met
    check_on_air(r)
    r.min_spacing = 3.0  # as the harness sets it from spacing_seconds
    with pytest.raises(AssertionError, match="apart on air"):
        check_on_air(r)


def test_guard_is_per_connection_unless_a_spacing_is_given(
    radio: tuple[FakeTcpRadio, _Clock],
) -> None:
    r, clock = radio
    _air(r, clock, 0.0, b"one")
    r.connections += 1  # a new client (e.g. the bot restarted)
    _air(r, clock, 1.0, b"two")
    check_on_air(r)
    with pytest.raises(AssertionError, match="apart on air"):
        check_on_air(r, spacing=3.0)
