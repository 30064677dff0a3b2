"""The pacing rule (``bot.transports.mesh_airtime``), table-tested on numbers: time on air,
spacing, the channel rule and the duty cycle. The transport's use of it, against the fake
radio, is tested in tests/test_mesh_courtesy.py."""

from __future__ import annotations

import pytest

from bot.transports.mesh_airtime import (
    FIRMWARE_CHANNEL_LIMIT,
    METRICS_MAX_AGE,
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
    # a one-packet notice goes at once: others 22% + the bot's minute are far under 40%
    assert p.wait(110.0, 0.4, last=100.0, urgent=True).wait == 0.0
    # it still goes below the firmware's 40% (max_channel_util_percent), counting the bot's own
    # minute: with others at 37%, 3% of room (1.8 s a minute) is taken by the 2 s part until
    # it leaves the minute
    p.note_metrics(Metrics(channel_utilization=37.0 + 3.33, air_util_tx=0.1), at=110.0)
    urgent = p.wait(110.0, 0.4, last=100.0, urgent=True)
    assert urgent.reason == "slow" and urgent.wait == pytest.approx(50.0)
    assert p.wait(160.5, 0.4, last=100.0, urgent=True).wait == 0.0
    p.note_metrics(
        Metrics(channel_utilization=FIRMWARE_CHANNEL_LIMIT + 5, air_util_tx=0.1), at=110.0
    )
    assert p.wait(110.0, 0.4, last=100.0, urgent=True).reason == "hold"
    hold = p.hold_estimate(110.0, 2.0)
    assert hold is not None and hold.reason == "hold" and hold.seconds >= 60.0  # the notice


def test_the_duty_cycle_stops_the_bot_until_the_hour_frees_room() -> None:
    p = _pacer(duty_cycle=1.0)  # 36 s of airtime per hour
    for i in range(18):
        p.wrote(1000.0 + i * 20, 2.0)
    v = p.wait(1400.0, 2.0, last=1340.0)
    assert v.reason == "duty"
    # answers stop at 90% of the budget (32.4 s): the third packet must age out first
    assert v.wait == pytest.approx(1040.0 + 3600 - 1400.0)
    assert p.hourly_share(1400.0) == pytest.approx(1.0)


def test_the_radios_own_hourly_figure_counts_too() -> None:
    p = _pacer(duty_cycle=10.0)
    p.note_metrics(
        Metrics(channel_utilization=1.0, air_util_tx=10.5), at=50.0
    )  # relays, firmware ACKs
    v = p.wait(50.0, 1.0, last=0.0)
    assert (v.reason, v.wait) == ("duty", 10.0)
    assert p.wait(50.0, 1.0, last=0.0, urgent=True).reason == "duty"  # the firmware refuses


def test_a_notice_goes_until_the_node_is_over_its_duty_cycle_as_the_firmware_rules() -> None:
    """The firmware refuses a packet only when the node's hourly TX share is *over* the
    region's duty cycle (Router::send): at exactly 10% a notice still goes, answers do not."""
    p = _pacer(duty_cycle=10.0)
    p.note_metrics(Metrics(channel_utilization=1.0, air_util_tx=10.0), at=50.0)
    assert p.wait(50.0, 0.9, last=0.0).reason == "duty"
    assert p.wait(50.0, 0.9, last=0.0, urgent=True).wait == 0.0
    assert p.hold_estimate(50.0, 0.9, urgent=True) is None


def test_notices_have_a_reserve_of_the_duty_cycle_and_count_against_it() -> None:
    p = _pacer(duty_cycle=1.0)  # answers stop at 32.4 s of the hour, notices at 36 s
    for i in range(16):
        p.wrote(1000.0 + i * 20, 2.0)  # 32 s
    assert p.wait(1400.0, 2.0, last=1340.0).reason == "duty"
    assert p.wait(1400.0, 0.5, last=1340.0, urgent=True).wait == 0.0  # "busy" can still go
    for i in range(8):
        p.wrote(1400.0 + i * 3, 0.5)  # notices are in the ledger like answers
    held = p.wait(1430.0, 0.5, last=1421.0, urgent=True)
    assert held.reason == "duty"  # the reserve is spent too: nothing more goes
    hold = p.hold_estimate(1430.0, 2.0)
    assert hold is not None and hold.reason == "duty" and hold.seconds > 3000


def test_a_report_that_stopped_coming_expires_and_the_ledger_decides() -> None:
    p = _pacer(duty_cycle=10.0)
    p.note_metrics(Metrics(channel_utilization=40.0, air_util_tx=12.0), at=100.0)
    assert p.wait(150.0, 1.0, last=0.0).reason == "duty"  # the radio's hourly figure
    assert p.stale(150.0) is False and p.expires_in(150.0) == pytest.approx(130.0)
    # three minutes without a report: it no longer describes the channel; the bot's own
    # ledger (empty) decides, and the channel rule is off
    v = p.wait(100.0 + METRICS_MAX_AGE + 1, 1.0, last=0.0)
    assert (v.reason, v.wait) == ("", 0.0)
    assert p.stale(100.0 + METRICS_MAX_AGE + 1) and p.others(400.0) is None
    assert p.hold_estimate(400.0, 1.0) is None


@pytest.mark.parametrize("field", ["channel_utilization", "air_util_tx"])
def test_a_report_of_100_percent_holds_everything_and_says_for_how_long(field: str) -> None:
    p = _pacer()
    p.note_metrics(Metrics(**{"channel_utilization": 1.0, "air_util_tx": 1.0, field: 100.0}), 0.0)
    assert p.wait(1.0, 0.4, last=-10.0).reason in ("hold", "duty")
    assert p.wait(1.0, 0.4, last=-10.0, urgent=True).reason in ("hold", "duty")
    hold = p.hold_estimate(1.0, 1.9, urgent=True)
    assert hold is not None and hold.seconds >= 60.0
    if field == "air_util_tx":  # 90 of 100 points of the hour must age out: about 54 min
        assert hold.reason == "duty" and hold.seconds == pytest.approx(3240.0)


def test_a_reported_duty_cycle_estimate_is_the_time_the_hour_needs_to_age_it_out() -> None:
    p = _pacer(duty_cycle=10.0)
    p.note_metrics(Metrics(channel_utilization=2.0, air_util_tx=12.0), at=0.0)
    hold = p.hold_estimate(0.0, 1.9)
    assert hold is not None and hold.reason == "duty"
    assert hold.seconds == pytest.approx(3600 * (12.0 - 9.0) / 12.0)  # 15 min, not "1 min"
