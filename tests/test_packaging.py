"""Dependencies: bounded ranges, numpy only with the embeddings extra (and never imported
without it), and constraints.txt pinning what CI tested, used by Docker and install.sh."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[canonicalize_name(name)] = version
    return pins


def _requirements() -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in ("meshtastic", "discord", "embeddings", "postgres"):
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return reqs


def test_every_dependency_has_an_upper_bound() -> None:
    for req in _requirements():
        assert any(s.operator in ("<", "<=", "~=", "==") for s in req.specifier), str(req)


def test_numpy_is_only_in_the_embeddings_extra() -> None:
    core = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    assert "numpy" not in core
    assert any(r.startswith("numpy") for r in PROJECT["optional-dependencies"]["embeddings"])


def test_the_bot_starts_without_importing_numpy() -> None:
    code = (
        "import sys, bot.cli, bot.app, bot.memory.store, bot.transports.meshtastic; "
        "print('numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    assert out.strip() == "False"


def test_constraints_pin_every_runtime_dependency_within_its_range() -> None:
    pins = _pins()
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt (make constraints)"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req} vs {pins[name]}"
    for dev_tool in ("pytest", "mypy", "ruff", "hypothesis"):
        assert dev_tool not in pins  # runtime only


def test_docker_install_and_make_use_the_constraints() -> None:
    assert "-c constraints.txt" in (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert '-c "$SRC/constraints.txt"' in (REPO / "systemd" / "install.sh").read_text()
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    run_target = re.search(r"^\$\(RUNTIME\):.*\n\t(.*)$", makefile, re.M)
    assert run_target and "-c constraints.txt" in run_target.group(1)
    assert "[dev]" not in run_target.group(1)  # make run installs runtime dependencies only
