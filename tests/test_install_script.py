"""systemd/install.sh in a throwaway root (MESHSAGE_ROOT) with systemctl stubbed and a python
whose ``-m venv`` makes a venv that runs this checkout's code (pip is stubbed: no downloads).

What is real: the script itself, bash, the meshsage CLI it validates with (check-config
--service --env-file, the same preflight `run` applies), the files it writes and their modes.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config import load_config

REPO = Path(__file__).resolve().parents[1]
INSTALL = REPO / "systemd" / "install.sh"

FAKE_PYTHON = f"""#!/usr/bin/env bash
# python3 stand-in: "-m venv DIR" builds a venv whose python is this test's interpreter and
# whose pip only records what it was asked to install; anything else runs the real python.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    [ -n "${{FAIL_VENV:-}}" ] && {{ mkdir -p "$3"; echo "ensurepip is not available" >&2; exit 1; }}
    mkdir -p "$3/bin"
    printf '#!/bin/sh\\nexec {sys.executable} "$@"\\n' >"$3/bin/python"
    printf '#!/bin/sh\\necho "pip $*" >>"%s/../pip.log"\\n' "$3" >"$3/bin/pip"
    printf '#!/bin/sh\\nexec {sys.executable} -m bot.cli "$@"\\n' >"$3/bin/meshsage"
    chmod +x "$3/bin/python" "$3/bin/pip" "$3/bin/meshsage"
    exit 0
fi
if [ -n "${{NO_ENSUREPIP:-}}" ] && [ "$1" = "-c" ] && [[ "$2" == *ensurepip* ]]; then exit 1; fi
if [ -n "${{BITS32:-}}" ] && [ "$1" = "-c" ] && [[ "$2" == *calcsize* ]]; then exit 1; fi
exec {sys.executable} "$@"
"""

SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >>"$MESHSAGE_ROOT/systemctl.log"
[ "$1" = "is-active" ] && exit 3
exit 0
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "stubs"
    bin_dir.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("systemctl", SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "root"
    root.mkdir()
    return root


def install(
    root: Path, *args: str, stdin: str = "", **extra_env: str
) -> subprocess.CompletedProcess[str]:
    stubs = root.parent / "stubs"
    env = {
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "HOME": str(root.parent / "home"),
        "MESHSAGE_ROOT": str(root),
        "PYTHON": str(stubs / "python3"),
        "PYTHONPATH": str(REPO),
        "MESHSAGE_SERIAL_DIR": str(root.parent / "by-id"),
        **extra_env,
    }
    return subprocess.run(
        ["bash", str(INSTALL), *args], input=stdin, capture_output=True, text=True,
        env=env, timeout=120, check=False,
    )  # fmt: skip


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_fresh_install_with_flags_writes_a_config_that_runs(root: Path) -> None:
    result = install(root, "--tcp", "192.0.2.7:4403", "--model", "qwen2.5:1.5b", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    config_path = root / "etc" / "meshsage" / "config.yaml"
    config = load_config(config_path, env={})
    assert config.meshtastic is not None and config.meshtastic.host == "192.0.2.7"
    assert config.meshtastic.port == 4403 and config.llm.model == "qwen2.5:1.5b"
    assert "OK (transports: meshtastic" in result.stdout  # validated with the shared check
    assert "Start it with: sudo systemctl start meshsage" in result.stdout
    log = (root / "systemctl.log").read_text()
    assert "systemctl daemon-reload" in log and "systemctl enable meshsage.service" in log
    unit = root / "etc" / "systemd" / "system" / "meshsage.service"
    assert unit.read_text() == (REPO / "systemd" / "meshsage.service").read_text()
    assert _mode(config_path) == 0o640 and _mode(root / "etc" / "meshsage" / "env") == 0o640
    assert _mode(root / "var" / "lib" / "meshsage") == 0o700
    pip = (root / "opt" / "meshsage" / "pip.log").read_text()
    assert f"-c {REPO}/constraints.txt {REPO}[meshtastic,discord]" in pip
    wrapper = (root / "usr" / "local" / "bin" / "meshsage").read_text()
    assert "MESHSAGE_STATE_DIR:=/var/lib/meshsage" in wrapper


def test_rerun_is_idempotent_and_keeps_the_config(root: Path) -> None:
    assert install(root, "--tcp", "192.0.2.7", "--yes").returncode == 0
    config_path = root / "etc" / "meshsage" / "config.yaml"
    config_path.write_text(config_path.read_text() + "# operator's note\n")
    before = config_path.read_text()
    env_before = (root / "etc" / "meshsage" / "env").read_text()
    again = install(root, "--yes")
    assert again.returncode == 0, again.stderr
    assert "keeping existing" in again.stdout and "creating virtualenv" not in again.stdout
    assert config_path.read_text() == before
    assert (root / "etc" / "meshsage" / "env").read_text() == env_before


def test_a_half_made_venv_is_repaired(root: Path) -> None:
    broken = root / "opt" / "meshsage" / ".venv"
    (broken / "bin").mkdir(parents=True)  # what `python3 -m venv` leaves without python3-venv
    result = install(root, "--tcp", "192.0.2.7", "--yes")
    assert result.returncode == 0, result.stderr
    assert "repairing the half-made virtualenv" in result.stdout
    assert (broken / "bin" / "python").exists()


def test_missing_python3_venv_is_named_before_anything_is_made(root: Path) -> None:
    result = install(root, "--tcp", "192.0.2.7", "--yes", NO_ENSUREPIP="1")
    assert result.returncode == 1
    assert "sudo apt install python3-venv" in result.stderr
    assert not (root / "opt").exists()
    failed = install(root, "--tcp", "192.0.2.7", "--yes", FAIL_VENV="1")
    assert failed.returncode == 1 and "python3-venv" in failed.stderr
    assert not (root / "opt" / "meshsage" / ".venv").exists()  # no half-made venv left


def test_no_transport_is_refused_without_saying_ok(root: Path) -> None:
    result = install(root, "--yes")
    assert result.returncode == 1
    assert "choose at least one transport" in result.stderr
    assert "Start it with" not in result.stdout
    assert not (root / "etc" / "meshsage" / "config.yaml").exists()


def test_an_existing_console_only_config_fails_the_check(root: Path) -> None:
    etc = root / "etc" / "meshsage"
    etc.mkdir(parents=True)
    (etc / "config.yaml").write_text((REPO / "config.example.yaml").read_text())
    result = install(root, "--yes")
    assert result.returncode == 1
    assert "only transport is the console" in result.stderr
    assert "the config above would not run" in result.stderr
    assert "Start it with" not in result.stdout


def test_discord_token_goes_to_the_env_file(root: Path) -> None:
    result = install(root, "--discord", "--yes", DISCORD_TOKEN="tok.en.value")
    assert result.returncode == 0, result.stderr
    env_file = (root / "etc" / "meshsage" / "env").read_text()
    assert "DISCORD_TOKEN=tok.en.value" in env_file
    assert "tok.en.value" not in (root / "etc" / "meshsage" / "config.yaml").read_text()
    again = install(root, "--yes")  # the same root: config and token kept, still valid
    assert again.returncode == 0, again.stderr


def test_discord_without_a_token_is_refused_before_anything_is_installed(root: Path) -> None:
    result = install(root, "--discord", "--yes")
    assert result.returncode == 1
    assert "DISCORD_TOKEN is not set" in result.stderr and "Nothing was installed" in result.stderr
    assert not (root / "opt").exists() and not (root / "etc").exists()  # no venv, no pip
    assert not (root / "systemctl.log").exists()  # nothing enabled


def test_interactive_questions_pick_the_radio(root: Path) -> None:
    by_id = root.parent / "by-id"
    by_id.mkdir()
    radio = by_id / "usb-RAK_WisBlock_0123-if00"
    radio.write_text("")
    result = install(root, "--interactive", stdin="1\nn\n\nllama3.2:1b\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1) " + str(radio) in result.stderr
    config = load_config(root / "etc" / "meshsage" / "config.yaml", env={})
    assert config.meshtastic is not None and config.meshtastic.device == str(radio)
    assert config.llm.model == "llama3.2:1b" and config.discord is None


def test_a_32_bit_userland_is_refused_with_the_reason(root: Path) -> None:
    result = install(root, "--tcp", "192.0.2.7", "--yes", BITS32="1")
    assert result.returncode == 1
    assert "a 64-bit OS is required" in result.stderr and "32-bit" in result.stderr
    assert not (root / "opt").exists()


def _outside_alarm(root: Path) -> Path:
    """Make `systemctl` on PATH a tripwire: any call leaves a file outside the root."""
    tripped = root.parent / "real-systemctl-was-called"
    (root.parent / "stubs" / "systemctl").write_text(f"#!/bin/sh\ntouch {tripped}\nexit 1\n")
    return tripped


def test_test_root_mode_touches_nothing_outside_the_root(root: Path) -> None:
    tripped = _outside_alarm(root)
    before = sorted(p.name for p in root.parent.iterdir())
    result = install(root, "--tcp", "192.0.2.7", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not tripped.exists(), "the real systemctl was called in MESHSAGE_ROOT mode"
    assert sorted(p.name for p in root.parent.iterdir()) == before  # only the root changed
    log = (root / "systemctl.log").read_text().splitlines()
    assert log == ["systemctl daemon-reload", "systemctl enable meshsage.service",
                   "systemctl enable --now meshsage-backup.timer",
                   "systemctl is-active --quiet meshsage.service"]  # fmt: skip


def test_backup_directory_and_daily_timer_are_installed(root: Path) -> None:
    result = install(root, "--tcp", "192.0.2.7", "--yes")
    assert result.returncode == 0, result.stderr
    backups = root / "var" / "lib" / "meshsage" / "backups"
    assert backups.is_dir() and _mode(backups) == 0o700
    units = root / "etc" / "systemd" / "system"
    for name in ("meshsage-backup.service", "meshsage-backup.timer"):
        assert (units / name).read_text() == (REPO / "systemd" / name).read_text()
    service = (units / "meshsage-backup.service").read_text()
    assert "meshsage backup --missing-ok --keep 7 /var/lib/meshsage/backups/" in service
    assert "OnCalendar=daily" in (units / "meshsage-backup.timer").read_text()


def test_no_backup_timer_skips_the_timer(root: Path) -> None:
    result = install(root, "--tcp", "192.0.2.7", "--yes", "--no-backup-timer")
    assert result.returncode == 0, result.stderr
    assert not (root / "etc" / "systemd" / "system" / "meshsage-backup.timer").exists()
    assert "backup.timer" not in (root / "systemctl.log").read_text()
    assert (root / "var" / "lib" / "meshsage" / "backups").is_dir()  # `meshsage backup` by hand


def test_rerun_with_other_flags_keeps_the_config_and_shows_the_difference(root: Path) -> None:
    assert install(root, "--tcp", "192.0.2.7", "--yes").returncode == 0
    config_path = root / "etc" / "meshsage" / "config.yaml"
    before = config_path.read_text()
    again = install(root, "--tcp", "192.0.2.99", "--model", "qwen2.5:1.5b", "--yes")
    assert again.returncode == 0, again.stderr
    assert config_path.read_text() == before  # kept
    assert "your options differ" in again.stdout
    assert "-  host: 192.0.2.7" in again.stdout and "+  host: 192.0.2.99" in again.stdout
    assert '+  model: "qwen2.5:1.5b"' in again.stdout
    assert "config.yaml.old" in again.stdout  # how to use the options instead
    same = install(root, "--tcp", "192.0.2.7", "--yes")  # the same options: no difference shown
    assert same.returncode == 0 and "differ" not in same.stdout


def test_a_config_that_fails_the_check_enables_nothing(root: Path) -> None:
    result = install(root, "--tcp", "192.0.2.7:notaport", "--yes")
    assert result.returncode == 1
    assert "meshtastic.port: must be a whole number" in result.stderr
    assert "nothing was enabled" in result.stderr
    log = root / "systemctl.log"
    assert not log.exists() or "enable" not in log.read_text()
    etc = root / "etc" / "meshsage"
    assert not (etc / "config.yaml").exists() and not (etc / ".config.yaml.new").exists()
    assert not (root / "etc" / "systemd" / "system" / "meshsage.service").exists()
    fixed = install(root, "--tcp", "192.0.2.7:4403", "--yes")  # re-run with the fix: installs
    assert fixed.returncode == 0, fixed.stderr
    assert "systemctl enable meshsage.service" in (root / "systemctl.log").read_text()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--serial", "/dev/x", "--tcp", "h", "--yes"], "not both"),
        (["--tcp", "h", "--llm-url", "localhost:11434", "--yes"], "must start with http://"),
    ],
    ids=["two-radios", "llm-url-without-scheme"],
)
def test_bad_options_are_refused_before_anything_is_installed(
    root: Path, args: list[str], words: str
) -> None:
    result = install(root, *args)
    assert result.returncode == 1 and words in result.stderr
    assert not (root / "opt").exists() and not (root / "etc").exists()


def test_web_lan_writes_a_token_guarded_web_section_that_passes_the_check(root: Path) -> None:
    result = install(root, "--tcp", "192.0.2.7", "--web-lan", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    env_file = root / "etc" / "meshsage" / "env"
    lines = [x for x in env_file.read_text().splitlines() if x.startswith("MESHSAGE_WEB_TOKEN=")]
    assert len(lines) == 1 and len(lines[0].split("=", 1)[1]) == 48
    token = lines[0].split("=", 1)[1]
    assert token not in result.stdout + result.stderr  # told where it is, not what it is
    config = load_config(root / "etc" / "meshsage" / "config.yaml", env={})
    assert config.web.enabled and config.web.bind == "0.0.0.0"
    assert config.web.token_env == "MESHSAGE_WEB_TOKEN"
    assert "OK (transports: meshtastic" in result.stdout  # the check found the token
    pip = (root / "opt" / "meshsage" / "pip.log").read_text()
    assert f"{REPO}[meshtastic,discord,web]" in pip
    again = install(root, "--yes")  # a re-run keeps the token
    assert again.returncode == 0 and env_file.read_text().count("MESHSAGE_WEB_TOKEN=") == 1


def test_the_interactive_web_question_serves_this_machine_only(root: Path) -> None:
    result = install(root, "--interactive", stdin="t\n192.0.2.9\nn\n\n\nl\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "web view [n]:" in result.stderr
    config = load_config(root / "etc" / "meshsage" / "config.yaml", env={})
    assert config.web.enabled and config.web.bind == "127.0.0.1" and config.web.token_env is None
    assert "MESHSAGE_WEB_TOKEN=" not in (root / "etc" / "meshsage" / "env").read_text()


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (("--meshcore-tcp", "192.0.2.9"), {"connection": "tcp", "host": "192.0.2.9", "port": 5000}),
        (("--meshcore-tcp", "192.0.2.9:5001"), {"connection": "tcp", "port": 5001}),
        (("--meshcore-serial", "/dev/ttyUSB7"), {"connection": "serial", "device": "/dev/ttyUSB7"}),
    ],
)
def test_meshcore_flags_write_a_meshcore_section_and_install_its_extra(
    root: Path, flags: tuple[str, ...], expect: dict[str, object]
) -> None:
    result = install(root, *flags, "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_config(root / "etc" / "meshsage" / "config.yaml", env={})
    assert config.meshcore is not None and config.meshtastic is None
    assert {k: getattr(config.meshcore, k) for k in expect} == expect
    assert "OK (transports: meshcore" in result.stdout
    pip = (root / "opt" / "meshsage" / "pip.log").read_text()
    assert f"{REPO}[meshtastic,discord,meshcore]" in pip


def test_two_meshcore_links_are_refused(root: Path) -> None:
    result = install(root, "--meshcore-tcp", "192.0.2.9", "--meshcore-serial", "/dev/x", "--yes")
    assert result.returncode != 0 and "one MeshCore companion" in result.stderr
    assert not (root / "opt").exists()
