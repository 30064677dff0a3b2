"""The web view's pages and /metrics, served by the running app (real transport on the fake
radio, fake LLM over HTTP, SQLite), fetched over HTTP with aiohttp's client: what each page
shows, that the People page and /metrics carry no text or person, and that a reply and a
radio's metrics reach the figures."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import pytest

from bot.app import App, build
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE
from tests.fakes.fake_transport import FakeTransport
from tests.fakes.mesh_harness import mesh_harness
from tests.web_harness import client, web_app

SECRET = "my secret plan about the tower"


async def _until_sampled(app: App, cond: object, what: str) -> None:
    assert app.web is not None
    for _ in range(500):
        await app.web.sample()
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


async def test_every_page_and_metrics_answer_with_the_running_bots_figures(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "The answer."
    async with (
        mesh_harness(start=False) as h,
        web_app(tmp_path, fake_llm, h) as app,
        client(app) as http,
    ):
        h.radio.inject_channel_utilization(12.5)  # the radio reports its metrics
        h.radio.inject_text(SECRET, frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the answer on air")
        await app.responder.wait_idle()
        assert app.web is not None
        await _until_sampled(
            app,
            lambda: (
                app.web is not None
                and app.web.snapshot is not None
                and app.web.snapshot.mesh is not None
                and app.web.snapshot.mesh.channel_utilization is not None
                and app.web.snapshot.totals["answers"] == 1
            ),
            "the answer and the metrics in a sample",
        )
        bodies = {}
        for path in ("/", "/airtime", "/nodes", "/people", "/metrics"):
            async with http.get(path) as r:
                assert r.status == 200, path
                assert r.headers["X-Frame-Options"] == "DENY"
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
                bodies[path] = await r.text()
        for body in bodies.values():
            assert SECRET not in body and "The answer." not in body  # never message text
        now = bodies["/"]
        assert "healthy" in now and "meshtastic" in now and "fake" in now  # model name
        assert "meshsage status" in now  # the status lines, as the terminal shows them
        air = bodies["/airtime"]
        assert "12.5%" in air  # channel utilisation as the radio reported it
        assert 'id="chart-hour"' in air and 'id="chart-day"' in air and "<svg" in air
        assert re.search(r'data-series="others" data-last="12\.5"', air)
        assert "<b id=answers-hour>1</b>" in air
        nodes = bodies["/nodes"]
        assert f"!{ALICE:08x}" in nodes  # Alice was heard; she sent 1, got 1
        assert "<b id=node-count>" in nodes
        people = bodies["/people"]
        assert f"{ALICE:08x}" not in people  # counts only
        assert "delivered" in people
        metrics = bodies["/metrics"]
        assert "meshsage_answers_total 1" in metrics
        util = re.search(r"^meshsage_mesh_channel_utilization_percent ([0-9.]+)$", metrics, re.M)
        assert util is not None and 12.5 <= float(util.group(1)) < 14  # others + the answer
        assert 'meshsage_transport_up{transport="meshtastic"} 1' in metrics
        assert 'meshsage_outbox_rows{state="delivered"} 1' in metrics
        assert "meshsage_llm_request_duration_seconds_count 1" in metrics
        assert "meshsage_first_part_duration_seconds_count 1" in metrics
        assert 'meshsage_llm_request_duration_seconds_bucket{le="+Inf"} 1' in metrics
        assert f"{ALICE:08x}" not in metrics and SECRET not in metrics


def _labels(text: str) -> set[str]:
    return {m for m in re.findall(r"\{([^}]*)\}", text)}


async def test_metrics_follow_the_text_format_with_fixed_labels_only(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    async with (
        mesh_harness(start=False) as h,
        web_app(tmp_path, fake_llm, h) as app,
        client(app) as http,
        http.get("/metrics") as r,
    ):
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await r.text()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert re.fullmatch(r"meshsage_[a-z_]+", name) and kind in (
                "gauge",
                "counter",
                "histogram",
                "summary",
            )
            assert kind != "counter" or name.endswith("_total")
            names.add(name)
        elif line and not line.startswith("#"):
            assert re.fullmatch(r'[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+-]+',
                                line), line  # fmt: skip
    keys = {kv.split("=")[0] for group in _labels(text) for kv in group.split(",")}
    assert keys <= {"version", "model", "transport", "direction", "le", "state", "cause", "reason"}


async def test_without_a_radio_the_airtime_and_nodes_pages_say_so(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    async with web_app(tmp_path, fake_llm, None) as app, client(app) as http:
        for path in ("/airtime", "/nodes"):
            async with http.get(path) as r:
                assert r.status == 200
                assert "No radio is configured" in await r.text()
        async with http.get("/metrics") as r:
            assert "meshsage_mesh_" not in await r.text()


async def test_an_unreachable_llm_shows_on_the_now_page_and_in_metrics(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.script = [("status", 503, "loading model")]
    async with (
        mesh_harness(start=False) as h,
        web_app(tmp_path, fake_llm, h) as app,
        client(app) as http,
    ):
        h.radio.inject_text("are you there?", frm=ALICE)
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the 'unavailable' notice")
        await app.responder.wait_idle()
        assert app.web is not None
        await app.web.sample()
        async with http.get("/") as r:
            now = await r.text()
        assert "the latest call failed" in now
        async with http.get("/metrics") as r:
            metrics = await r.text()
        assert "meshsage_llm_failures_total 1" in metrics
        assert "meshsage_notices_total 1" in metrics and "meshsage_answers_total 0" in metrics


async def test_a_taken_port_is_logged_with_the_fix_and_the_bot_serves_on(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = make_config(tmp_path, fake_llm.base_url, f"web:\n  enabled: true\n  port: {port}\n")
    transport = FakeTransport()
    app = await build(config, env={}, transports=[transport])
    try:
        await app.start()
        assert app.web is None
        assert any(
            f"cannot listen on 127.0.0.1:{port}" in r.getMessage() and "Fix:" in r.getMessage()
            for r in caplog.records
        )
        await transport.say("still there?")
        await app.responder.wait_idle()
        assert transport.sent  # people are still answered
    finally:
        await app.close()
        taken.close()
