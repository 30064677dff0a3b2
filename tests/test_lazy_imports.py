"""What a command does not use is not loaded (issue 43): the openai package costs about 0.5 s
of CPU and 45 MB of memory, so `meshsage --version`, `status` and `check-config`, and the
modules the memory tools import, do without it until a client is built."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _loaded(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(done.stdout.split())


@pytest.mark.parametrize(
    "code",
    [
        "import bot.cli",
        "import bot.commands",
        "import bot.memory.retrieval",
        "import bot.ops.cli_ops",
        "from bot.memory.embeddings import OpenAICompatEmbedder",
    ],
)
def test_openai_is_not_loaded_by_importing(code: str) -> None:
    assert "openai" not in _loaded(code)


def test_openai_is_loaded_when_a_client_is_built() -> None:
    code = (
        "from bot.config import EmbeddingsConfig, Endpoint\n"
        "from bot.memory.embeddings import OpenAICompatEmbedder\n"
        "OpenAICompatEmbedder(config=EmbeddingsConfig(enabled=True),\n"
        "                     llm=Endpoint(base_url='http://127.0.0.1:9/v1', model='m'), env={})"
    )
    assert "openai" in _loaded(code)


def test_version_does_not_load_openai() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bot.cli", "--version"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("meshsage ")
    assert "| openai" not in done.stderr
