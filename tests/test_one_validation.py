"""One validation, really: every config (and environment) gets the same verdict, the same
words and the same exit status from ``check-config``, from doctor's config check and from
``run``; what ``run`` refuses from config alone it refuses with exit 2 before it opens anything,
and ``--hold-on-config-error`` holds for all of it.

Missing optional packages are made missing the way Python sees it (``sys.modules[name] =
None``: ``import name`` raises ImportError and ``find_spec`` finds nothing), for the checks and
for ``run`` alike.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from pathlib import Path

import pytest

import bot.cli
from bot.cli import main
from bot.ops.doctor import Level, check_config
from tests.fakes.fake_llm import FakeLLM

TCP = "meshtastic: {connection: tcp, host: 192.0.2.1}\n"
DISCORD = "discord: {}\n"
TOKEN = {"DISCORD_TOKEN": "abc.def"}
RELAY = "relay: {pairs: [{mesh_channel: 0, discord_channel: 123456789012345678}]}\n"
PG = "storage: {url: 'postgresql://meshsage@db.invalid/meshsage'"

# (id, config text or None for no file, environment, packages made missing, None when the
#  config must be accepted, else words the one refusal must contain)
Case = tuple[str, str | None, dict[str, str], tuple[str, ...], list[str] | None]
CASES: list[Case] = [
    # --- refused -------------------------------------------------------------------------------
    ("no-file-defaults", None, {}, (), ["no config file", "meshsage chat"]),
    ("console-only", "console: {}\n", {}, (), ["only transport is the console"]),
    ("serial-without-device", "meshtastic: {connection: serial}\n", {}, (), ["needs 'device'"]),
    ("bare-meshtastic", "meshtastic:\n", {}, (), ["needs 'device'"]),
    ("tcp-without-host", "meshtastic: {connection: tcp}\n", {}, (), ["needs 'host'"]),
    ("all-disabled", "console: {enabled: false}\nmeshtastic: {enabled: false}\n", {}, (),
     ["every transport is disabled"]),
    ("state-dir-is-a-file", "state_dir: /etc/passwd\n" + TCP, {}, (), ["not a directory"]),
    ("env-state-dir", TCP, {"MESHSAGE_STATE_DIR": "/etc/passwd"}, (),
     ["environment variable MESHSAGE_STATE_DIR"]),
    ("env-bad-llm-url", TCP, {"MESHSAGE_LLM_BASE_URL": "localhost:11434"}, (),
     ["MESHSAGE_LLM_BASE_URL", "must start with http://"]),
    ("discord-token-missing", DISCORD, {}, (), ["DISCORD_TOKEN", "is not set"]),
    ("discord-token-blank", DISCORD, {"DISCORD_TOKEN": "  "}, (), ["DISCORD_TOKEN"]),
    ("custom-token-variable", "discord: {token_env: MY_BOT}\n", TOKEN, (), ["MY_BOT"]),
    ("token-variable-bad-name", "discord: {token_env: 1bad}\n", {}, (),
     ["discord.token_env", "name of an environment variable"]),
    ("type-error", "llm: {retries: lots}\n" + TCP, {}, (), ["llm.retries: must be a whole"]),
    ("range-error", "llm: {temperature: 9}\n" + TCP, {}, (), ["must be 2 or less"]),
    ("unknown-key", "llm: {modle: x}\n" + TCP, {}, (), ["did you mean 'model'"]),
    ("section-not-mapping", "console: 3\n", {}, (), ["console: must be a section"]),
    ("yaml-syntax", "llm: {model: [x\n", {}, (), ["not valid YAML", "line"]),
    ("top-level-list", "- llm\n", {}, (), ["top level must be a mapping"]),
    ("duplicate-llm-block", "llm: {model: a}\n" + TCP + "llm: {model: b}\n", {}, (),
     ["'llm' appears twice", "lines 1 and 3"]),
    ("duplicate-nested-key", "meshtastic:\n  connection: tcp\n  host: a\n  host: b\n", {}, (),
     ["'host' appears twice", "lines 3 and 4"]),
    ("two-problems", "meshtastic: {}\ndiscord: {}\n", {}, (), ["2 problems would stop the bot"]),
    ("relay-no-discord-section", TCP + RELAY, {}, (), ["relay: pairs", "no discord: section"]),
    ("relay-discord-disabled", TCP + "discord: {enabled: false}\n" + RELAY, TOKEN, (),
     ["relay: pairs", "discord: is disabled"]),
    ("relay-meshtastic-disabled",
     "meshtastic: {enabled: false, connection: tcp, host: x}\n" + DISCORD + RELAY, TOKEN, (),
     ["relay: pairs", "meshtastic: is disabled"]),
    ("relay-no-meshtastic-section", DISCORD + RELAY, TOKEN, (), ["no meshtastic: section"]),
    ("relay-neither", "console: {}\n" + RELAY, {}, (), ["relay: pairs", "2 problems"]),
    ("pg-password-unset", TCP + PG + ", password_env: PGPASS_X}\n", {}, (),
     ["storage.password_env names PGPASS_X, which is not set", "/etc/meshsage/env"]),
    ("pg-without-asyncpg", TCP + PG + "}\n", {}, ("asyncpg",),
     ["needs asyncpg", "meshsage[postgres]"]),
    ("pg-both-problems", TCP + PG + ", password_env: PGPASS_X}\n", {}, ("asyncpg",),
     ["2 problems", "PGPASS_X", "asyncpg"]),
    ("pg-password-in-url",
     TCP + "storage: {url: 'postgresql://meshsage:secret@db/meshsage'}\n", {}, (),
     ["must not contain a password"]),
    ("storage-bad-scheme", TCP + "storage: {url: 'mysql://db/x'}\n", {}, (),
     ["must start with sqlite:///"]),
    ("sqlite-url-under-a-file", TCP + "storage: {url: 'sqlite:////etc/passwd/m.db'}\n", {}, (),
     ["storage.url", "/etc/passwd is not a directory"]),
    ("embeddings-without-numpy", TCP + "memory: {embeddings: {enabled: true}}\n", {},
     ("numpy",), ["numpy is not installed", "meshsage[embeddings]"]),
    ("discord-without-discordpy", DISCORD, TOKEN, ("discord",),
     ["needs the discord package", "meshsage[discord]"]),
    ("meshtastic-without-package", TCP, {}, ("meshtastic",), ["needs the meshtastic package"]),
    # --- accepted ------------------------------------------------------------------------------
    ("tcp-radio", TCP, {}, (), None),
    ("discord-with-token", DISCORD, TOKEN, (), None),
    ("discord-custom-variable", "discord: {token_env: MY_BOT}\n", {"MY_BOT": "x.y"}, (), None),
    ("relay-both", TCP + DISCORD + RELAY, TOKEN, (), None),
    ("pg-with-password", TCP + PG + ", password_env: PGPASS_X}\n", {"PGPASS_X": "pw"}, (), None),
    ("pg-empty-password", TCP + PG + ", password_env: PGPASS_X}\n", {"PGPASS_X": ""}, (), None),
    ("pg-no-password-variable", TCP + PG + "}\n", {}, (), None),
    ("sqlite-url", TCP + "storage: {url: 'sqlite:///{tmp}/other/m.db'}\n", {}, (), None),
    ("embeddings-with-numpy", TCP + "memory: {embeddings: {enabled: true}}\n", {}, (), None),
    ("relay-unused-without-pairs", TCP + "relay: {webhook: false}\n", {}, (), None),
    ("yaml-anchor-and-merge",  # `<<:` merges may repeat a key on purpose: not a duplicate
     "meshtastic: &m {connection: tcp, host: x}\nconsole:\n  <<: {enabled: true}\n"
     "  enabled: false\n", {}, (), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "extra", "missing", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_check_config_doctor_and_run_give_one_verdict(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str | None,
    extra: dict[str, str],
    missing: tuple[str, ...],
    words: list[str] | None,
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key, value in extra.items():
        monkeypatch.setenv(key, value)
    if text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(text.replace("{tmp}", str(tmp_path)), encoding="utf-8")
        monkeypatch.setenv("MESHSAGE_CONFIG", str(path))
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # a service: no terminal
    served: list[list[str] | None] = []

    def serve(config: object, *, env: object, only: list[str] | None, console: bool) -> int:
        served.append(only)  # run got past every check; the rest is tested end to end elsewhere
        return 0

    monkeypatch.setattr(bot.cli, "_serve_locked", serve)

    check_rc = main(["check-config", "--service"])
    check_out = capsys.readouterr()
    run_rc = main(["run"])
    run_err = capsys.readouterr().err
    _, doctor = check_config(None, env=os.environ, interactive=False)

    if words is None:
        assert check_rc == 0, check_out.err
        assert "OK" in check_out.out
        assert doctor.level is Level.OK, doctor.detail
        assert run_rc == 0 and served == [None], run_err
        return
    assert (check_rc, run_rc) == (2, 2), (check_out.err, run_err)
    assert served == [], "run went past a config it should have refused"
    assert check_out.err == run_err, "check-config and run must say the same"
    message = run_err.removeprefix("meshsage: ").rstrip("\n")
    assert doctor.level is Level.FAIL and doctor.detail == message
    for word in words:
        assert word in message, message
    assert "Fix" in message and "Traceback" not in message
    assert not (tmp_path / "xdg" / "meshsage" / "meshsage.db").exists()  # refused before opening


def test_the_table_is_large_and_covers_both_verdicts() -> None:
    refused = [c for c in CASES if c[4] is not None]
    accepted = [c for c in CASES if c[4] is None]
    assert len(CASES) >= 45 and len(refused) >= 35 and len(accepted) >= 10


def test_check_config_names_a_postgresql_store_not_the_sqlite_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(TCP + PG + ", password_env: PGPASS_X}\n", encoding="utf-8")
    monkeypatch.setenv("PGPASS_X", "secret-pw")
    assert main(["check-config", "--service", str(path)]) == 0
    out = capsys.readouterr().out
    assert "store: PostgreSQL postgresql://meshsage@db.invalid/meshsage" in out
    assert "database:" not in out and "meshsage.db" not in out and "secret-pw" not in out


def test_check_config_env_file_supplies_a_token_set_only_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # /etc/meshsage/env as install.sh writes it: the token is in the file, not in the shell.
    path = tmp_path / "config.yaml"
    path.write_text("discord: {token_env: MESHSAGE_DISCORD}\n", encoding="utf-8")
    env_file = tmp_path / "env"
    env_file.write_text('# meshsage secrets\nexport MESHSAGE_DISCORD="tok.en"\n')
    monkeypatch.delenv("MESHSAGE_DISCORD", raising=False)
    assert main(["check-config", "--service", str(path)]) == 2
    assert "MESHSAGE_DISCORD" in capsys.readouterr().err
    assert main(["check-config", "--service", "--env-file", str(env_file), str(path)]) == 0
    assert "OK (transports: discord" in capsys.readouterr().out
    assert main(["doctor", "--config", str(path), "--env-file", str(env_file)]) in (0, 1)
    assert "ok   config:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "env"),
    [
        (TCP + RELAY, {}),  # relay without discord: exit 1 and a restart loop before
        (TCP + PG + ", password_env: PGPASS_X}\n", {}),  # unset password: exit 3 before
    ],
    ids=["relay-no-discord", "pg-password-unset"],
)
async def test_hold_on_config_error_holds_for_every_refusal(
    tmp_path: Path, text: str, env: dict[str, str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", "--hold-on-config-error", "--config", str(path),
        env={"XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path), **env,
             "PATH": "/usr/bin:/bin"},
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    first = await asyncio.wait_for(proc.stderr.readline(), 60)
    assert first.startswith(b"meshsage: ") and b"Fix" in first
    waiting = await asyncio.wait_for(proc.stderr.readline(), 60)
    assert b"waiting" in waiting
    await asyncio.sleep(0.5)
    assert proc.returncode is None, "it should hold, not exit (a restart loop in a container)"
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 60) == 2


async def test_chat_on_a_relay_config_builds_no_bridge(tmp_path: Path, fake_llm: FakeLLM) -> None:
    # `meshsage chat` builds the console only; a relay config used to fail it with exit 1
    # ("relay: pairs need both ...") although check-config passed the same file.
    fake_llm.reply = "hello from the model"
    path = tmp_path / "config.yaml"
    path.write_text(TCP + DISCORD + RELAY, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), MESHSAGE_LLM_BASE_URL=fake_llm.base_url,
               **TOKEN)  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "chat", "--config", str(path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(b"hi\n"), 60)
    assert proc.returncode == 0, err.decode()
    assert "hello from the model" in out.decode()
