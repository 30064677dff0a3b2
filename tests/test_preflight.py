"""check-config and run agree: one preflight judges every config the same way for both, for
the file and the environment overrides alike, and names the source and the fix."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from pathlib import Path

import pytest

from bot.cli import main
from bot.ops.status import STATUS_FILE
from tests.fakes.fake_llm import FakeLLM

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = (REPO / "config.example.yaml").read_text(encoding="utf-8")

# (id, config text or None for no file, extra environment, words the refusal must contain)
REFUSED: list[tuple[str, str | None, dict[str, str], list[str]]] = [
    ("example-console-only", EXAMPLE, {}, ["only transport is the console", "not a terminal"]),
    ("no-file-defaults", None, {}, ["no config file", "meshsage chat"]),
    ("serial-without-device", "meshtastic: {connection: serial}\n", {},
     ["connection: serial needs 'device'", "device: /dev/serial/by-id/"]),
    ("bare-meshtastic", "meshtastic:\n", {}, ["needs 'device'"]),
    ("tcp-without-host", "meshtastic: {connection: tcp}\n", {}, ["needs 'host'", "host: "]),
    ("all-disabled", "console: {enabled: false}\nmeshtastic: {enabled: false}\n", {},
     ["every transport is disabled", "Fix: enable"]),
    ("state-dir-is-a-file", "state_dir: /etc/passwd\nmeshtastic: {connection: tcp, host: x}\n",
     {}, ["state_dir", "/etc/passwd is not a directory", "Fix:"]),
    ("discord-token-missing", "discord: {}\n", {},
     ["DISCORD_TOKEN", "is not set", "/etc/meshsage/env"]),
    ("custom-token-variable", "discord: {token_env: MY_BOT}\n", {}, ["MY_BOT", "is not set"]),
    ("env-state-dir", "meshtastic: {connection: tcp, host: x}\n",
     {"MESHSAGE_STATE_DIR": "/etc/passwd"},
     ["environment variable MESHSAGE_STATE_DIR", "not a directory"]),
    ("env-bad-url", "meshtastic: {connection: tcp, host: x}\n",
     {"MESHSAGE_LLM_BASE_URL": "localhost:11434"},
     ["from environment variable MESHSAGE_LLM_BASE_URL", "must start with http://"]),
    ("type-error", "llm: {retries: lots}\nmeshtastic: {connection: tcp, host: x}\n", {},
     ["llm.retries: must be a whole number", "Fix: change llm.retries in"]),
    ("range-error", "llm: {temperature: 9}\nmeshtastic: {connection: tcp, host: x}\n", {},
     ["llm.temperature: must be 2 or less (got 9)"]),
    ("section-not-mapping", "console: 3\n", {}, ["console: must be a section"]),
    ("two-problems", "meshtastic: {}\ndiscord: {}\n", {},
     ["2 problems would stop the bot", "needs 'device'", "DISCORD_TOKEN"]),
]  # fmt: skip

JARGON = ("Input should", "valid dictionary", "instance of", "valid tuple", "pydantic")


def _env(tmp_path: Path, text: str | None, extra: dict[str, str]) -> dict[str, str]:
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home"), **extra}
    if text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(text, encoding="utf-8")
        env["MESHSAGE_CONFIG"] = str(path)
    return env


@pytest.mark.parametrize(
    ("text", "extra", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_check_config_and_run_refuse_alike(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str | None,
    extra: dict[str, str],
    words: list[str],
) -> None:
    for key, value in _env(tmp_path, text, extra).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # a service has no terminal
    verdicts = {}
    for command in (["check-config"], ["check-config", "--service"], ["run"], ["run", "-v"]):
        rc = main(command)
        err = capsys.readouterr().err
        verdicts[" ".join(command)] = (rc, err)
    assert {rc for rc, _ in verdicts.values()} == {2}, verdicts
    messages = {err for _, err in verdicts.values()}
    assert len(messages) == 1, verdicts  # the same words from both commands
    message = messages.pop()
    for word in words:
        assert word in message
    assert "Fix" in message
    assert not [j for j in JARGON if j in message]
    assert "Traceback" not in message
    assert not (tmp_path / "xdg" / "meshsage" / "meshsage.db").exists()  # refused before opening


def test_chat_may_pipe_a_script_into_the_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same console-only config `run` refuses without a terminal is fine for `chat < file`.
    for key, value in _env(tmp_path, EXAMPLE, {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "stdin", io.StringIO())
    assert main(["check-config"]) == 2
    capsys.readouterr()
    from bot.config import load_config
    from bot.ops import preflight

    config = load_config(None, env=os.environ)
    preflight.check(config, env=os.environ, interactive=False, only=["console"],
                    scripted_console=True)  # fmt: skip


def test_check_config_reads_meshsage_config_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in _env(
        tmp_path, "meshtastic: {connection: tcp, host: 192.0.2.1}\n", {}
    ).items():
        monkeypatch.setenv(key, value)
    assert main(["check-config", "-v"]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / 'config.yaml'}: OK (transports: meshtastic" in out


def test_env_file_supplies_the_token_like_systemd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in _env(tmp_path, "discord: {}\n", {}).items():
        monkeypatch.setenv(key, value)
    env_file = tmp_path / "env"
    env_file.write_text("# secrets\nDISCORD_TOKEN='abc.def'\n#OPENAI_API_KEY=\n")
    assert main(["check-config", "--service"]) == 2
    capsys.readouterr()
    assert main(["check-config", "--service", "--env-file", str(env_file)]) == 0


async def test_run_starts_what_check_config_passes(tmp_path: Path, fake_llm: FakeLLM) -> None:
    # A radio on a TCP port nobody listens on: the config is valid, the link reconnects in the
    # background, and the service runs (it is not "dead" after a second) until SIGTERM.
    text = "meshtastic: {connection: tcp, host: 127.0.0.1, port: 9, reconnect_initial: 30}\n"
    env = {**_env(tmp_path, text, {}), "MESHSAGE_LLM_BASE_URL": fake_llm.base_url,
           "PATH": os.environ.get("PATH", "")}  # fmt: skip
    check = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "check-config", "--service", env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(check.communicate(), 60)
    assert check.returncode == 0 and b"OK" in out
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    status = tmp_path / "xdg" / "meshsage" / STATUS_FILE
    for _ in range(3000):  # generous: up to 60 s on a loaded machine
        if status.exists() or proc.returncode is not None:
            break
        await asyncio.sleep(0.02)
    assert proc.returncode is None, "run exited although check-config passed the config"
    assert status.exists()
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert not status.exists()  # a stopped bot leaves no status behind
