"""meshsage doctor against a healthy setup (fake LLM on 127.0.0.1, fake radio on a pty, a fake
Discord API) and against each broken one: the right line, the fix, the exit status."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from bot.memory.store import SqliteStore
from bot.ops.doctor import Level, check_serial, diagnose, run_doctor
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import FakePtyRadio, FakeTcpRadio

GOOD_TOKEN = "good.token.value"


class FakeDiscordApi:
    """Just GET /users/@me: 200 for the good token, 401 otherwise."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _me(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") == f"Bot {GOOD_TOKEN}":
            return web.json_response({"id": "1", "username": "meshsage-bot"})
        return web.json_response({"message": "401: Unauthorized", "code": 0}, status=401)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v10/users/@me", self._me)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/api/v10"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def discord_api() -> AsyncIterator[FakeDiscordApi]:
    api = FakeDiscordApi()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
def radio() -> Iterator[FakePtyRadio]:
    r = FakePtyRadio()
    yield r
    r.unplug()


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n" + text, encoding="utf-8")
    return str(path)


def _healthy(fake_llm: FakeLLM, device: str) -> str:
    return (
        f"llm: {{base_url: '{fake_llm.base_url}', model: fake, connect_timeout: 2}}\n"
        f"meshtastic: {{connection: serial, device: '{device}'}}\n"
        "discord: {}\n"
    )


async def _doctor(config: str, env: dict[str, str], api: FakeDiscordApi) -> tuple[int, list[str]]:
    lines: list[str] = []
    rc = await run_doctor(config_path=config, env=env, out=lines.append, discord_api=api.url)
    return rc, lines


def _line(lines: list[str], name: str) -> str:
    found = [x for x in lines if x.split(" ", 1)[1].lstrip().startswith(f"{name}:")]
    assert len(found) == 1, lines
    return found[0]


async def test_healthy_setup_passes_every_check(
    tmp_path: Path, fake_llm: FakeLLM, radio: FakePtyRadio, discord_api: FakeDiscordApi
) -> None:
    fake_llm.reply = "OK"
    config = _config(tmp_path, _healthy(fake_llm, radio.path))
    store = await SqliteStore.open(tmp_path / "state" / "meshsage.db")
    await store.close()
    rc, lines = await _doctor(config, {"DISCORD_TOKEN": GOOD_TOKEN}, discord_api)
    assert rc == 0, lines
    assert lines[-1] == "doctor: all checks passed"
    for name in ("config", "state dir", "database", "llm", "llm completion", "tokenizer",
                 "radio", "discord", "disk"):  # fmt: skip
        assert _line(lines, name).startswith("ok "), lines
    assert "integrity ok" in _line(lines, "database")
    assert "answered in" in _line(lines, "llm completion")
    assert "cl100k offline" in _line(lines, "tokenizer")
    assert "bot user meshsage-bot" in _line(lines, "discord")
    assert fake_llm.chat_requests()[-1]["max_tokens"] == 8  # a tiny round trip


@pytest.mark.parametrize(
    ("case", "check", "words"),
    [
        ("llm-down", "llm", ["cannot reach", "Fix: start the server"]),
        ("model-missing", "llm", ["has no model 'absent'", "ollama pull absent"]),
        ("completion-fails", "llm completion", ["tiny completion failed", "HTTP 500"]),
        ("radio-missing", "radio", ["does not exist", "/dev/serial/by-id/"]),
        ("token-rejected", "discord", ["rejected the token in DISCORD_TOKEN", "Reset Token"]),
        ("database-damaged", "database", ["Fix:"]),
        ("state-dir-loose", "state dir", ["readable by others", "chmod 700"]),
    ],
)
async def test_each_broken_setup_fails_with_its_fix(
    tmp_path: Path,
    fake_llm: FakeLLM,
    radio: FakePtyRadio,
    discord_api: FakeDiscordApi,
    case: str,
    check: str,
    words: list[str],
) -> None:
    env = {"DISCORD_TOKEN": GOOD_TOKEN}
    text = _healthy(fake_llm, radio.path)
    (tmp_path / "state").mkdir(mode=0o700)
    if case == "llm-down":
        text = text.replace(fake_llm.base_url, "http://127.0.0.1:9/v1")
    elif case == "model-missing":
        text = text.replace("model: fake", "model: absent")
    elif case == "completion-fails":
        fake_llm.script = [("status", 500, {"error": "boom"})]
    elif case == "radio-missing":
        text = text.replace(radio.path, "/dev/serial/by-id/usb-not-plugged-in")
    elif case == "token-rejected":
        env["DISCORD_TOKEN"] = "revoked"
    elif case == "database-damaged":
        (tmp_path / "state" / "meshsage.db").write_bytes(b"SQLite format 3\x00" + b"\x07" * 4096)
    elif case == "state-dir-loose":
        (tmp_path / "state").chmod(0o755)
    rc, lines = await _doctor(_config(tmp_path, text), env, discord_api)
    line = _line(lines, check)
    expected = "warn" if case == "state-dir-loose" else "FAIL"
    assert line.startswith(expected), lines
    for word in words:
        assert word in line, line
    assert rc == (0 if expected == "warn" else 1), lines
    failed = [x for x in lines if x.startswith("FAIL")]
    assert len(failed) == (0 if expected == "warn" else 1), lines  # one cause, one failure


async def test_invalid_config_exits_2_with_the_config_message(
    tmp_path: Path, discord_api: FakeDiscordApi
) -> None:
    rc, lines = await _doctor(_config(tmp_path, "llm: {retries: lots}\n"), {}, discord_api)
    assert rc == 2
    assert lines[0].startswith("FAIL config:") and "llm.retries: must be a whole number" in lines[0]
    rc, lines = await _doctor(_config(tmp_path, "discord: {}\n"), {}, discord_api)
    assert rc == 2 and "DISCORD_TOKEN" in lines[0]
    assert "FAIL discord: DISCORD_TOKEN is not set" in "\n".join(lines)


async def test_tcp_radio_reachable_and_not(tmp_path: Path, fake_llm: FakeLLM) -> None:
    tcp = FakeTcpRadio()
    try:
        config = _config(
            tmp_path,
            f"llm: {{base_url: '{fake_llm.base_url}', model: fake}}\n"
            f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {tcp.port}}}\n",
        )
        checks = {c.name: c for c in await diagnose(config_path=config, env={})}
        assert checks["radio"].level is Level.OK
    finally:
        tcp.stop()
    checks = {c.name: c for c in await diagnose(config_path=config, env={})}
    assert checks["radio"].level is Level.FAIL and "cannot connect" in checks["radio"].detail


def test_serial_permission_denied_names_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = tmp_path / "ttyUSB0"
    device.write_bytes(b"")
    device.chmod(0o660)
    if os.geteuid() == 0:  # root may open anything: only here is os.access stood in for
        real_access = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode: False if str(p) == str(device) else real_access(p, mode)
        )
    monkeypatch.setattr(os, "getgroups", lambda: [])
    check = check_serial(str(device))
    assert check.level is Level.FAIL and "not readable and writable" in check.detail
    assert "not a member" in check.detail and "usermod -aG" in check.fix


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    from bot.ops.doctor import check_database

    path = tmp_path / "meshsage.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE schema_migrations (name TEXT PRIMARY KEY, applied_at REAL);"
        "INSERT INTO schema_migrations (name) VALUES ('999_from_the_future');"
        "CREATE TABLE messages (id INTEGER);"
    )
    db.close()
    check = check_database(path)
    assert check.level is Level.FAIL and "newer meshsage" in check.detail
