"""A node whose link stays open but which sends nothing (wedged firmware, half-open TCP) is
found within minutes when it was sending its device metrics every minute, not after
``stale_after`` (15 min by default, while status said ``meshtastic: up``). The real transport
and the unmodified library against the fake radio, on the virtual clock."""

from __future__ import annotations

from tests.fakes.mesh_harness import mesh_harness


async def test_a_wedged_node_that_reported_every_minute_is_probed_and_rebuilt_in_minutes() -> None:
    async with mesh_harness(stale_after=900.0, probe_timeout=30.0, metrics_every=60) as h:
        await h.clock.sleep(200)  # three reports: the node reports every minute
        assert h.transport._generation == 1 and h.radio.reports >= 3
        frozen_at = h.clock.monotonic()
        h.radio.freeze()  # no reports, no answers; the socket stays open
        await h.until(lambda: h.transport.health().link != "up", "the wedge noticed")
        noticed = h.clock.monotonic() - frozen_at
        await h.connected(2)
    # three missed reports (180 s) + a watchdog look (30 s) + the probe (30 s), not 900 s
    assert noticed <= 180 + 30 + 30 + 1


async def test_a_node_that_never_reports_metrics_keeps_the_stale_after_rule() -> None:
    async with mesh_harness(
        stale_after=900.0, probe_timeout=30.0, metrics_every=60, metrics=False
    ) as h:
        await h.clock.sleep(600)  # quiet: nothing says this node should have spoken
        assert h.transport._generation == 1
        assert h.transport.health().link == "up"
