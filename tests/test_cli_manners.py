"""The CLI's manners toward a person at a terminal: a chat says at once (one plain line) when
nothing answers at the LLM URL, prints no log lines without -v, output to a closed pipe ends
quietly, --help reads cleanly; doctor's extra looks (/v1, a path that is not a radio, an unset
API key variable)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.config import LLMConfig
from bot.ops.doctor import Level, check_llm, check_serial
from bot.ops.status import STATUS_FILE, Status, write_atomic
from tests.fakes.fake_llm import FakeLLM
from tests.test_console_tty import _read_until


def _env(tmp_path: Path, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), MESHSAGE_LLM_BASE_URL=base_url,
               TIKTOKEN_CACHE_DIR="")  # fmt: skip
    return env


async def test_chat_without_an_llm_says_so_once_and_logs_nothing(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    err_path = tmp_path / "stderr.txt"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "chat"],
            stdin=slave, stdout=slave, stderr=err, close_fds=True,
            env={**_env(tmp_path, "http://127.0.0.1:9/v1")},
        )  # fmt: skip
    os.close(slave)
    try:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _read_until, master, b"you> ")
        for _ in range(200):  # the probe runs in the background: its line comes soon
            if b"nothing answers" in err_path.read_bytes():
                break
            await asyncio.sleep(0.05)
        os.write(master, b"hello\n")
        out = await loop.run_in_executor(None, _read_until, master, b"you> ")
        os.write(master, b"\x04")
        assert await loop.run_in_executor(None, proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    err_text = err_path.read_text()
    lines = [line for line in err_text.splitlines() if line.strip()]
    hint = [line for line in lines if "nothing answers at http://127.0.0.1:9/v1" in line]
    assert len(hint) == 1 and "Fix:" in hint[0] and "ollama" in hint[0].lower(), err_text
    assert lines == hint, f"log lines in an interactive chat: {lines}"
    assert b"meshsage (notice)> LLM unavailable" in out  # an answer line, not a log line
    assert b"thinking... (Ctrl-C to stop)\r\x1b[Kmeshsage (notice)>" in out  # nothing glued
    assert b"WARNING" not in out and b"ERROR" not in out


async def test_chat_points_at_v1_when_the_root_was_configured(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    root = fake_llm.base_url.removesuffix("/v1")
    from bot.ops.probe import warn_if_unreachable

    said: list[str] = []
    await warn_if_unreachable(root, said.append)
    assert len(said) == 1 and "base_url should end in /v1" in said[0] and f"{root}/v1" in said[0]
    said.clear()
    await warn_if_unreachable(fake_llm.base_url, said.append)
    assert said == []  # a working URL: not a word


def _status_file(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    now = time.time()
    write_atomic(state / STATUS_FILE, Status(written_at=now, started_at=now - 60, pid=1,
                                             version="t", healthy=True).to_json())  # fmt: skip


def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    # `meshsage status | head -3` where head has gone: the read end is closed before the
    # command writes, so every write fails with EPIPE, deterministically.
    _status_file(tmp_path)
    for args in (["status"], ["status", "--json"], ["--help"], ["check-config", "--help"]):
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "bot.cli", *args], stdout=write,
                stderr=subprocess.PIPE, env=_env(tmp_path, "http://127.0.0.1:9/v1"), timeout=60,
            )  # fmt: skip
        finally:
            os.close(write)
        err = done.stderr.decode()
        assert "Traceback" not in err and "BrokenPipeError" not in err, (args, err)
        assert err == "", (args, err)
        assert done.returncode in (0, 141), (args, done.returncode)


def test_help_is_clean(tmp_path: Path) -> None:
    env = _env(tmp_path, "http://127.0.0.1:9/v1")
    done = subprocess.run([sys.executable, "-m", "bot.cli", "--help"], capture_output=True,
                          text=True, env=env, check=True)  # fmt: skip
    text = done.stdout
    assert "``" not in text and "Command line:" not in text and "Invariants" not in text
    assert "LLM chat bot for Meshtastic mesh radios and Discord" in text
    assert text.split("\n\n")[1].strip().endswith("as the service.")  # a whole sentence


async def test_doctor_says_add_v1(fake_llm: FakeLLM) -> None:
    root = fake_llm.base_url.removesuffix("/v1")
    checks = await check_llm(LLMConfig(base_url=root, model="fake"), env={})
    by = {c.name: c for c in checks}
    assert by["llm"].level is Level.FAIL and "base_url should end in /v1" in by["llm"].fix
    assert f"{root}/v1" in by["llm"].fix and by["llm completion"].level is Level.SKIP
    fine = await check_llm(LLMConfig(base_url=fake_llm.base_url, model="fake"), env={})
    assert {c.name: c.level for c in fine}["llm"] is Level.OK


async def test_doctor_warns_about_an_unset_api_key_variable(fake_llm: FakeLLM) -> None:
    """A hosted API (not a local address) with its key variable unset is a warning; the
    same unset variable for a server on this machine (the default config) is not."""
    remote = LLMConfig(  # TEST-NET-3: not local, and nothing answers (a short timeout)
        base_url="http://203.0.113.7:9/v1", model="m", api_key_env="MY_LLM_KEY",
        connect_timeout=0.3,
    )  # fmt: skip
    by = {c.name: c for c in await check_llm(remote, env={})}
    assert by["llm key"].level is Level.WARN and "MY_LLM_KEY" in by["llm key"].detail
    by = {c.name: c for c in await check_llm(remote, env={"MY_LLM_KEY": "k"})}
    assert "llm key" not in by
    local = LLMConfig(base_url=fake_llm.base_url, model="fake", api_key_env="OPENAI_API_KEY")
    assert "llm key" not in {c.name for c in await check_llm(local, env={})}


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://localhost:11434/v1", True),
        ("http://127.0.0.1:8080/v1", True),
        ("http://[::1]:8080/v1", True),
        ("http://192.168.1.20:11434/v1", True),
        ("http://10.0.0.5/v1", True),
        ("http://ollama:11434/v1", True),  # a compose service name
        ("http://pi4.local:11434/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://203.0.113.7/v1", False),
    ],
)
def test_local_servers_need_no_api_key(url: str, local: bool) -> None:
    from bot.ops.probe import is_local

    assert is_local(url) is local


def test_doctor_refuses_a_radio_path_that_is_not_a_tty(tmp_path: Path) -> None:
    check = check_serial("/dev/null")
    assert check.level is Level.FAIL and "not a serial port" in check.detail
    assert "/dev/serial/by-id/" in check.fix
    master, slave = pty.openpty()  # a real terminal device is accepted
    try:
        assert check_serial(os.ttyname(slave)).level is Level.OK
    finally:
        os.close(master)
        os.close(slave)


def test_status_json_is_still_json(tmp_path: Path) -> None:
    _status_file(tmp_path)
    env = _env(tmp_path, "http://x/v1")
    done = subprocess.run([sys.executable, "-m", "bot.cli", "status", "--json"],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout)["healthy"] is True
