"""The web view's guard, through aiohttp's test client against the real server object: the
token (missing, wrong, right, cookie), the loopback-only Host check, read-only methods, the
headers on every answer, the config and preflight refusals, a week of samples with flat
memory, live streams that end and free their slot, and 1,000 nodes heard."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

from bot.config import WebConfig, load_config
from bot.errors import ConfigError
from bot.ops import preflight
from bot.ops.status import Status, TransportStatus
from bot.transports.mesh_view import MeshView, NodeSeen
from bot.web.history import History
from bot.web.model import OutboxState, Snapshot
from bot.web.server import COOKIE, WebServer

TOKEN = "a-long-random-test-token-1234567890"


def snapshot(*, at: float | None = None, nodes: int = 3, answers: int = 0) -> Snapshot:
    now = time.time() if at is None else at
    status = Status(
        written_at=now, started_at=now - 3600, pid=1, version="0.1.0", healthy=True,
        transports={"meshtastic": TransportStatus(link="up", ok=True)}, store="SQLite /x.db",
    )  # fmt: skip
    mesh = MeshView(
        link="up", channel_utilization=18.0, air_util_tx=1.0, bot_hour_share=0.5, others=17.0,
        channel_limit=20.0, duty_cycle=10.0, holding="", holds={"hold": 2}, outbox_waiting=0,
        nodes=tuple(
            NodeSeen(id=f"!{i:08x}", name=f"Node {i} (N{i})", last_heard=now - i, snr=5.25,
                     rssi=-90, hops=1, battery=80, from_node=1)
            for i in range(nodes)
        ),
    )  # fmt: skip
    return Snapshot(
        at=now, status=status, model="fake", context_tokens={"meshtastic": 1536},
        llm_failures=0, llm_last_ok=None, llm_total=0, llm_seconds_total=0.0, llm_buckets=(0,) * 10,
        totals={"answers": answers, "notices": 0, "turns": answers, "limited": 0},
        first_reply_p50=None, first_reply_total=0.0, first_part_total=0.0,
        first_part_count=0, people_waiting=0, turns_waiting=0,
        outbox=(OutboxState("pending", 0, None),), mesh=mesh, gateway=None, other_gateways=(),
        last_backup=None, errors=(),
    )  # fmt: skip


class Fixed:
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    async def collect(self) -> Snapshot:
        return self.snap


def server(token: str | None = None, *, snap: Snapshot | None = None, **cfg: object) -> WebServer:
    config = WebConfig.model_validate(
        {"enabled": True, "refresh": 0.2, **({"token_env": "T"} if token else {}), **cfg}
    )
    return WebServer(config=config, token=token, collector=Fixed(snap or snapshot()))


async def test_with_a_token_every_path_needs_it_and_a_wrong_one_is_refused() -> None:
    web = server(TOKEN)
    async with TestClient(TestServer(web.app)) as c:
        for path in ("/", "/airtime", "/nodes", "/people", "/metrics", "/events", "/static/app.js"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                r = await c.get(path, headers=headers, allow_redirects=False)
                assert r.status == 401, (path, headers)
                assert r.headers["X-Frame-Options"] == "DENY"
                assert TOKEN not in await r.text()
        r = await c.get("/?token=wrong" + TOKEN, allow_redirects=False)
        assert r.status == 401
        r = await c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status == 200 and "meshsage_healthy 1" in await r.text()


async def test_the_token_in_the_address_once_sets_a_cookie_and_leaves_the_address() -> None:
    web = server(TOKEN)
    async with TestClient(TestServer(web.app)) as c:
        r = await c.get(f"/nodes?token={TOKEN}", allow_redirects=False)
        assert r.status == 303 and r.headers["Location"] == "/nodes"
        cookie = r.cookies[COOKIE]
        assert cookie.value == TOKEN and cookie["httponly"] and cookie["samesite"] == "Strict"
        r = await c.get("/nodes")  # the client keeps the cookie, as a browser does
        assert r.status == 200 and "Node 1 (N1)" in await r.text()


async def test_without_a_token_only_loopback_host_names_are_answered() -> None:
    web = server()
    async with TestClient(TestServer(web.app)) as c:
        assert (await c.get("/")).status == 200
        for host in ("evil.example", "192.168.1.5:8470", "meshsage.lan"):  # DNS rebinding
            r = await c.get("/", headers={"Host": host})
            assert r.status == 421, host
        assert (await c.get("/", headers={"Host": "localhost:8470"})).status == 200


async def test_pages_are_read_only_and_unknown_paths_get_the_headers_too() -> None:
    web = server()
    async with TestClient(TestServer(web.app)) as c:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            r = await c.request(method, "/")
            assert r.status == 405, method
            assert r.headers["X-Content-Type-Options"] == "nosniff"
        r = await c.get("/nope")
        assert r.status == 404 and r.headers["X-Frame-Options"] == "DENY"
        r = await c.get("/")
        assert r.headers["Cache-Control"] == "no-store"
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        assert r.headers["Referrer-Policy"] == "no-referrer"


def test_a_bind_beyond_the_loopback_without_a_token_is_refused_by_check_config(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("web:\n  enabled: true\n  bind: 0.0.0.0\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(cfg, env={})
    assert "needs a token" in str(err.value) and "token_env" in str(err.value)
    cfg.write_text("web:\n  enabled: false\n  bind: 0.0.0.0\n", encoding="utf-8")
    load_config(cfg, env={})  # off: nothing to refuse


def test_a_missing_or_short_token_is_a_preflight_problem_naming_the_variable(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "meshtastic:\n  connection: tcp\n  host: 127.0.0.1\n"
        "web:\n  enabled: true\n  bind: 0.0.0.0\n  token_env: WEB_TOKEN\n",
        encoding="utf-8",
    )
    config = load_config(cfg, env={})
    found = preflight.problems(config, env={}, interactive=False)
    assert any("WEB_TOKEN, which is not set" in p for p in found), found
    found = preflight.problems(config, env={"WEB_TOKEN": "tiny5"}, interactive=False)
    assert any("at least 16" in p for p in found) and "tiny5" not in str(found)
    assert not [
        p for p in preflight.problems(config, env={"WEB_TOKEN": TOKEN}, interactive=False)
        if "web" in p
    ]  # fmt: skip


async def test_a_week_of_samples_keeps_the_history_the_same_size() -> None:
    history = History()
    start = 1_800_000_000.0
    for i in range(7 * 24 * 60):  # one sample a minute for a week
        history.add(snapshot(at=start + 60 * i, nodes=0, answers=i))
    assert len(history.hour) == 60 and len(history.day) == 96
    hour = history.hour.series(start + 60 * (7 * 24 * 60 - 1))
    assert all(b is not None and b.counts.get("answers") == 1 for b in hour)


async def test_a_live_stream_sends_changes_and_ends_when_the_server_stops() -> None:
    web = server()
    async with TestClient(TestServer(web.app)) as c:
        r = await c.get("/events?page=airtime", timeout=ClientTimeout(total=20))
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        assert await r.content.readline() == b"retry: 5000\n"
        await r.content.readline()
        assert (await r.content.readline()).startswith(b"event: update")
        assert b"chart-hour" in await r.content.readline()
        assert web.viewers == 1
        await web.stop()  # a restart: the stream ends; the browser's EventSource reconnects
        assert await asyncio.wait_for(r.content.read(), 10) is not None
        for _ in range(100):
            if web.viewers == 0:
                break
            await asyncio.sleep(0.01)
        assert web.viewers == 0


async def test_more_live_viewers_than_allowed_are_told_to_come_back() -> None:
    web = server(max_viewers=1)
    async with TestClient(TestServer(web.app)) as c:
        first = await c.get("/events?page=now")
        assert first.status == 200
        await first.content.readline()
        second = await c.get("/events?page=now")
        assert second.status == 503 and second.headers["Retry-After"] == "30"
        first.close()
        await web.stop()


async def test_a_thousand_nodes_heard_are_listed() -> None:
    web = server(snap=snapshot(nodes=1000))
    async with TestClient(TestServer(web.app)) as c:
        r = await c.get("/nodes")
        text = await r.text()
        assert "<b id=node-count>1000</b>" in text
        assert text.count("<tr>") == 1001 and "!000003e7" in text
        r = await c.get("/metrics")
        assert "meshsage_mesh_nodes_heard 1000" in await r.text()
