"""Static checks of the Dockerfile, .dockerignore and the compose example.

No Docker engine runs where these tests run, so the image is never built here; these checks
catch the mistakes that matter most (root user, wrong entrypoint, secrets baked in, state outside
the volume, a stop timeout shorter than the drain).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.app import STOP_SECONDS
from bot.config import ENV_CONFIG, ENV_LLM_BASE_URL, ENV_STATE_DIR

REPO = Path(__file__).resolve().parents[1]
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|APIKEY", re.I)

Instruction = tuple[str, str]  # (INSTRUCTION, arguments)


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order, with backslash continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, args = full.partition(" ")
        instructions.append((word.upper(), " ".join(args.split())))
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


def env_pairs(args: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in args.split())


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile((REPO / "Dockerfile").read_text(encoding="utf-8"))


def args_of(instructions: list[Instruction], word: str) -> list[str]:
    return [a for w, a in instructions if w == word]


def test_parser_joins_continuations() -> None:
    parsed = parse_dockerfile("FROM x\n# c\nRUN a \\\n    # inner\n    && b\nUSER me\n")
    assert parsed == [("FROM", "x"), ("RUN", "a && b"), ("USER", "me")]


def test_base_image_is_pinned_python_311_slim(dockerfile: list[Instruction]) -> None:
    assert dockerfile[0][0] == "FROM"
    for image in args_of(dockerfile, "FROM"):
        # a patch release and a Debian release, not a moving "3.11-slim"
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), image


def test_dependencies_install_in_their_own_layer_before_the_code(
    dockerfile: list[Instruction],
) -> None:
    copies = [(i, a.split()) for i, (w, a) in enumerate(dockerfile) if w == "COPY"]
    runs = [(i, a) for i, (w, a) in enumerate(dockerfile) if w == "RUN"]
    deps_copy = next(i for i, srcs in copies if "pyproject.toml" in srcs)
    assert "bot" not in copies[0][1] and "constraints.txt" in dict(copies)[deps_copy]
    code_copy = next(i for i, srcs in copies if "bot" in srcs[:-1])
    deps_run = [i for i, a in runs if "-c constraints.txt" in a and deps_copy < i < code_copy]
    assert deps_run, "no pip install -c constraints.txt between the manifest and code copies"
    after = [a for i, a in runs if i > code_copy]
    assert after and all("--no-deps" in a for a in after if "pip install" in a)


def test_healthcheck_uses_the_status_command(dockerfile: list[Instruction]) -> None:
    (check,) = args_of(dockerfile, "HEALTHCHECK")
    options, _, command = check.partition(" CMD ")
    assert json.loads(command) == ["meshsage", "status"]
    assert "--start-period=" in options and "--interval=" in options


def test_missing_config_waits_instead_of_restart_looping(dockerfile: list[Instruction]) -> None:
    assert json.loads(args_of(dockerfile, "CMD")[-1]) == ["run", "--hold-on-config-error"]


def test_runs_as_a_non_root_user(dockerfile: list[Instruction]) -> None:
    users = args_of(dockerfile, "USER")
    assert users, "no USER: the container would run as root"
    assert users[-1] not in {"root", "0", "0:0"}
    # USER comes after every RUN, so nothing later silently needs root.
    last_user = max(i for i, (w, _) in enumerate(dockerfile) if w == "USER")
    assert all(i < last_user for i, (w, _) in enumerate(dockerfile) if w == "RUN")
    assert any("--uid" in a and users[-1] in a for a in args_of(dockerfile, "RUN"))


def test_installs_the_package_from_the_checkout_with_pinned_dependencies(
    dockerfile: list[Instruction],
) -> None:
    copies = " ".join(args_of(dockerfile, "COPY")).split()
    assert "pyproject.toml" in copies
    assert "bot" in copies
    assert any(re.search(r"pip install -c constraints.txt [\"']?\.\[", a)
               for a in args_of(dockerfile, "RUN"))  # fmt: skip


def test_entrypoint_is_the_console_script(dockerfile: list[Instruction]) -> None:
    assert json.loads(args_of(dockerfile, "ENTRYPOINT")[-1]) == ["meshsage"]
    assert args_of(dockerfile, "STOPSIGNAL") == ["SIGTERM"]


def test_state_lives_in_the_volume_and_config_is_mounted(dockerfile: list[Instruction]) -> None:
    env: dict[str, str] = {}
    for args in args_of(dockerfile, "ENV"):
        env.update(env_pairs(args))
    assert env[ENV_STATE_DIR] == "/data"
    assert env[ENV_CONFIG] == "/config/config.yaml"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert "/data" in args_of(dockerfile, "VOLUME")


def test_no_secrets_baked_into_the_image(dockerfile: list[Instruction]) -> None:
    for word in ("ENV", "ARG", "LABEL"):
        for args in args_of(dockerfile, word):
            names = [pair.split("=", 1)[0] for pair in args.split()]
            assert not [n for n in names if SECRET_NAME.search(n)], f"{word} {args}"
    sources = [
        src
        for args in args_of(dockerfile, "COPY") + args_of(dockerfile, "ADD")
        for src in args.split()[:-1]
    ]
    assert sources
    assert not [s for s in sources if s in {".", "env", "config.yaml"} or s.endswith(".env")]


def test_dockerignore_keeps_secrets_and_state_out_of_the_context() -> None:
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "*.db", "*.db-wal", "*.env", "config.yaml"} <= ignored


def test_compose_example_wires_ollama_radio_and_grace_period() -> None:
    compose: dict[str, Any] = yaml.safe_load(
        (REPO / "docker-compose.example.yml").read_text(encoding="utf-8")
    )
    bot = compose["services"]["meshsage"]
    assert "ollama" in compose["services"]
    grace = re.fullmatch(r"(\d+)s", bot["stop_grace_period"])
    assert grace and int(grace.group(1)) >= STOP_SECONDS + 10
    assert bot["environment"][ENV_LLM_BASE_URL] == "http://ollama:11434/v1"
    assert any(d.startswith("/dev/serial/by-id/") for d in bot["devices"])
    assert any(v.endswith(":/data") for v in bot["volumes"])
    assert int(compose["services"]["ollama"]["environment"]["OLLAMA_CONTEXT_LENGTH"]) >= 8192
    inline = " ".join(f"{k}={v}" for k, v in bot["environment"].items())
    assert not SECRET_NAME.search(inline), "secrets belong in env_file, not compose"


def test_every_file_the_dockerfile_and_compose_cite_exists() -> None:
    for name in ("Dockerfile", "docker-compose.example.yml", "config.example.yaml", "README.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        for cited in re.findall(r"(?<![/\w])((?:docs|systemd)/[\w./-]+\.(?:md|sh|service))", text):
            assert (REPO / cited).exists(), f"{name} cites {cited}"


async def test_hold_on_config_error_prints_the_fix_and_waits(tmp_path: Path) -> None:
    import asyncio
    import os
    import signal
    import sys

    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
           "MESHSAGE_CONFIG": str(tmp_path / "config" / "config.yaml")}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", "--hold-on-config-error", env=env,
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    lines = [await asyncio.wait_for(proc.stderr.readline(), 60) for _ in range(2)]
    assert b"file not found (environment variable MESHSAGE_CONFIG names it)" in lines[0]
    assert b'-v "$PWD/config:/config:ro"' in lines[0]
    assert b"waiting" in lines[1]
    assert proc.returncode is None  # not exiting: no restart loop
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 60) == 2
