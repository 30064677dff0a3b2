"""The pacing rule (``bot.transports.mesh_airtime``), table-tested on numbers: time on air,
spacing, the channel rule and the duty cycle. The transport's use of it, against the fake
radio, is tested in tests/test_mesh_courtesy.py."""

from __future__ import annotations

import pytest

from bot.transports.mesh_airtime import (
    FIRMWARE_CHANNEL_LIMIT,
    Metrics,
    Pacer,
    lora_airtime,
)


def _pacer(**kw: float) -> Pacer:
    settings = {"spacing": 3.0, "channel_limit": 20.0, "duty_cycle": 10.0, "poll": 10.0, **kw}
    return Pacer(**settings)


@pytest.mark.parametrize(
    ("payload", "preset", "low", "high"),
    [
        (10, "LONG_FAST", 0.45, 0.5),  # a short notice on LongFast: about half a second
        (200, "LONG_FAST", 1.8, 2.0),  # a full part: about 1.9 s
        (200, "SHORT_FAST", 0.1, 0.2),
        (200, "LONG_SLOW", 12.0, 13.5),  # SF12/125 kHz/4:8 with low-data-rate optimisation
    ],
)
def test_time_on_air(payload: int, preset: str, low: float, high: float) -> None:
    assert low <= lora_airtime(payload, preset=preset) <= high


def test_without_metrics_only_spacing_applies() -> None:
    p = _pacer()
    p.wrote(100.0, 1.9)
    assert p.wait(101.0, 1.9, last=100.0).wait == pytest.approx(2.0)
    assert p.wait(103.0, 1.9, last=100.0).wait == 0.0  # no channel rule without metrics


def test_with_metrics_the_bot_spaces_itself_to_the_channel_limit() -> None:
    p = _pacer()
    p.note_metrics(Metrics(channel_utilization=0.0, air_util_tx=0.0), at=103.0)
    p.wrote(100.0, 2.0)
    v = p.wait(103.0, 2.0, last=100.0)
    # own share <= 20%: a 2 s packet every 10 s
    assert v.reason == "slow" and v.wait == pytest.approx(7.0)


def test_others_leave_less_room_and_fill_it_to_a_hold() -> None:
    p = _pacer()
    p.wrote(100.0, 2.0)  # own last minute: 2 s = 3.3%
    p.note_metrics(Metrics(channel_utilization=13.3 + 3.33, air_util_tx=0.1), at=110.0)
    v = p.wait(110.0, 2.0, last=100.0)
    assert v.reason == "slow" and v.wait == pytest.approx(2.0 * 100 / (20 - 13.3) - 10, 0.05)
    p.note_metrics(Metrics(channel_utilization=22.0 + 3.33, air_util_tx=0.1), at=110.0)
    held = p.wait(110.0, 2.0, last=100.0)
    assert (held.reason, held.wait) == ("hold", 10.0)  # re-checked every poll
    urgent = p.wait(110.0, 0.4, last=100.0, urgent=True)  # a one-packet "busy" still goes
    assert urgent.wait == 0.0
    p.note_metrics(
        Metrics(channel_utilization=FIRMWARE_CHANNEL_LIMIT + 5, air_util_tx=0.1), at=110.0
    )
    assert p.wait(110.0, 0.4, last=100.0, urgent=True).reason == "hold"
    assert p.hold_estimate(110.0, 2.0) >= 60.0  # what the "busy" notice says


def test_the_duty_cycle_stops_the_bot_until_the_hour_frees_room() -> None:
    p = _pacer(duty_cycle=1.0)  # 36 s of airtime per hour
    for i in range(18):
        p.wrote(1000.0 + i * 20, 2.0)
    v = p.wait(1400.0, 2.0, last=1340.0)
    assert v.reason == "duty"
    assert v.wait == pytest.approx(1000.0 + 3600 - 1400.0)  # when the first packet ages out
    assert p.hourly_share(1400.0) == pytest.approx(1.0)


def test_the_radios_own_hourly_figure_counts_too() -> None:
    p = _pacer(duty_cycle=10.0)
    p.note_metrics(
        Metrics(channel_utilization=1.0, air_util_tx=10.5), at=50.0
    )  # relays, firmware ACKs
    v = p.wait(50.0, 1.0, last=0.0)
    assert (v.reason, v.wait) == ("duty", 10.0)
