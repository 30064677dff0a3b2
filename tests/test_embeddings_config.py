"""memory.embeddings: off by default, strict, and borrowing the LLM's server and key when unset."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import load_config
from bot.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_off_by_default_with_short_timeouts() -> None:
    emb = load_config(None, env={}).memory.embeddings
    assert emb.enabled is False
    assert emb.model == "nomic-embed-text"
    assert emb.base_url is None and emb.api_key_env is None
    assert emb.connect_timeout <= 2 and emb.read_timeout <= 10
    assert 0 <= emb.weight <= 1 and emb.batch >= 1


def test_unset_endpoint_follows_the_llm_including_env_overrides(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "llm:\n  api_key_env: MY_KEY\nmemory:\n  embeddings:\n    enabled: true\n",
    )
    config = load_config(path, env={"MESHSAGE_LLM_BASE_URL": "http://gpu:8080/v1/"})
    assert config.memory.embeddings.endpoint(config.llm) == ("http://gpu:8080/v1", "MY_KEY")


def test_own_endpoint_and_key(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "memory:\n  embeddings:\n    base_url: http://emb:11434/v1/\n    api_key_env: EMB_KEY\n"
        "    model: all-minilm\n    weight: 0.25\n    batch: 8\n",
    )
    config = load_config(path, env={})
    emb = config.memory.embeddings
    assert emb.endpoint(config.llm) == ("http://emb:11434/v1", "EMB_KEY")
    assert (emb.model, emb.weight, emb.batch) == ("all-minilm", 0.25, 8)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("enabeld: true", "memory.embeddings.enabeld: unknown key. Fix: did you mean 'enabled'?"),
        ("weight: 1.5", "memory.embeddings.weight: must be 1 or less"),
        ("weight: -0.1", "memory.embeddings.weight: must be 0 or more"),
        ("batch: 0", "memory.embeddings.batch: must be 1 or more"),
        ("read_timeout: 0", "memory.embeddings.read_timeout: must be greater than 0"),
        ("base_url: localhost:11434", "must start with http:// or https://"),
        ("model: ' '", "must name an embedding model"),
        ("api_key_env: sk-abc123", "must be the name of an environment variable"),
        ("api_key: sk-abc123", "memory.embeddings.api_key: unknown key"),
    ],
)
def test_bad_values_name_the_key_and_the_fix(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, f"memory:\n  embeddings:\n    {text}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert expected in str(err.value)
    assert str(path) in str(err.value)


def test_example_config_documents_the_section() -> None:
    example = Path(__file__).parent.parent / "config.example.yaml"
    emb = load_config(example, env={}).memory.embeddings
    assert emb.enabled is False and emb.model == "nomic-embed-text"
    text = example.read_text(encoding="utf-8")
    for key in ("base_url", "api_key_env", "connect_timeout", "read_timeout", "batch", "weight"):
        assert f"    {key}:" in text or f"    # {key}:" in text
