"""Strict config: one message naming the file, the key path and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from bot.cli import main
from bot.config import Config, load_config
from bot.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_no_file_runs_console_on_defaults(tmp_path: Path) -> None:
    config = load_config(None, env={"XDG_DATA_HOME": "/ignored"})
    assert config.enabled_transports() == ["console"]
    assert config.llm.base_url == "http://localhost:11434/v1"
    assert config.database_path.name == "meshsage.db"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "llm:\n  model: from-file\n  base_url: http://file:1/v1\n")
    env = {
        "MESHSAGE_CONFIG": str(path),
        "MESHSAGE_STATE_DIR": str(tmp_path / "st"),
        "MESHSAGE_LLM_BASE_URL": "http://env:2/v1",
        "MESHSAGE_LLM_MODEL": "from-env",
    }
    config = load_config(None, env=env)
    assert config.llm.model == "from-env" and config.llm.base_url == "http://env:2/v1"
    assert config.database_path == tmp_path / "st" / "meshsage.db"


def test_many_problems_one_message(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "llm:\n  modle: x\n  read_timeout: -1\nbot:\n  queue_limit: lots\n"
        "meshtastic:\n  port: 99999\n",
    )
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    msg = str(err.value)
    assert msg.startswith(f"{path}: invalid configuration (4 problem(s))")
    assert "llm.modle: unknown key. Fix: did you mean 'model'?" in msg
    assert "llm.read_timeout: must be greater than 0 (got -1)" in msg
    assert "bot.queue_limit:" in msg and "'lots'" in msg
    assert "meshtastic.port:" in msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("llm: [1, 2]\n", "llm: must be a section: indented key: value lines under it"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("llm:\n  base_url: localhost:11434\n", "must start with http:// or https://"),
        ("llm: {base_url: 'http://x'\n", "not valid YAML"),
        ("bot:\n  operators: [alice]\n", "must be 'transport:person'"),
        ("llm:\n  api_key: sk-secret\n", "llm.api_key: unknown key"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        load_config(_write(tmp_path, text), env={})
    assert expected in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"file not found\. Fix"):
        load_config(tmp_path / "nope.yaml", env={})


def test_empty_transport_section_means_enabled(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "meshtastic:\n"), env={})
    assert config.enabled_transports() == ["meshtastic"]
    disabled = load_config(_write(tmp_path, "console:\n  enabled: false\nmeshtastic: {}\n"),
                           env={})  # fmt: skip
    assert disabled.enabled_transports() == ["meshtastic"]


def test_example_config_is_valid() -> None:
    example = Path(__file__).parent.parent / "config.example.yaml"
    config = load_config(example, env={})
    assert "console" in config.enabled_transports()


def test_check_config_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(
        tmp_path,
        "llm:\n  model: qwen2.5:1.5b\nmeshtastic:\n  connection: tcp\n  host: 192.0.2.1\n",
    )
    assert main(["check-config", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("nonsense_key: 1\n")
    assert main(["check-config", str(bad)]) == 2
    assert "nonsense_key: unknown key" in capsys.readouterr().err


def _keys(model: type[BaseModel]) -> set[str]:
    keys = set(model.model_fields)
    for field in model.model_fields.values():
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            for inner in (arg, *getattr(arg, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    keys |= _keys(inner)
    return keys


def test_example_documents_every_key() -> None:
    example = (Path(__file__).parent.parent / "config.example.yaml").read_text()
    missing = sorted(k for k in _keys(Config) if f"{k}:" not in example)
    assert missing == []
