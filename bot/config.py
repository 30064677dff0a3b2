"""Loading the configuration: the YAML file, environment overrides, and the messages for bad input.

The schema (every section, its defaults and ranges) lives in ``bot.config_schema``; this module
re-exports its names, so ``from bot.config import Config, load_config`` serves the whole code.
Loaded once by the CLI and handed to ``app.build``.

Invariants:
- Unknown keys, wrong types and out-of-range values fail with one ``ConfigError`` whose message
  names the source (the file and key, or the environment variable that set it), every bad key
  path and the fix in plain words (no validation-library jargon). Nothing starts on a bad config.
- A loaded ``Config`` remembers where it came from (``source``, ``env_keys``) so later checks
  (``bot.ops.preflight``) can blame the file or the variable too.
- Environment overrides (applied after the file): MESHSAGE_CONFIG (path), MESHSAGE_STATE_DIR,
  MESHSAGE_LLM_BASE_URL, MESHSAGE_LLM_MODEL.
- No file at all is valid: ``load_config()`` without a file gives the schema's defaults.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from bot.config_schema import (
    DEFAULT_SYSTEM_PROMPT,
    BotConfig,
    CatchUpConfig,
    Config,
    ConsoleConfig,
    DeliveryConfig,
    DiscordConfig,
    EmbeddingsConfig,
    Endpoint,
    LLMConfig,
    MemoryConfig,
    MeshCoreConfig,
    MeshtasticConfig,
    RateLimit,
    RelayConfig,
    RelayPair,
    RetrievalConfig,
    Snowflake,
    StorageConfig,
    SummaryConfig,
    TransportBase,
    WebConfig,
    default_state_dir,
)
from bot.errors import ConfigError
from bot.yaml_unique import load_unique

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "ENV_CONFIG",
    "ENV_LLM_BASE_URL",
    "ENV_LLM_MODEL",
    "ENV_STATE_DIR",
    "BotConfig",
    "CatchUpConfig",
    "Config",
    "ConsoleConfig",
    "DeliveryConfig",
    "DiscordConfig",
    "EmbeddingsConfig",
    "Endpoint",
    "LLMConfig",
    "MemoryConfig",
    "MeshCoreConfig",
    "MeshtasticConfig",
    "RateLimit",
    "RelayConfig",
    "RelayPair",
    "RetrievalConfig",
    "Snowflake",
    "StorageConfig",
    "SummaryConfig",
    "TransportBase",
    "WebConfig",
    "default_state_dir",
    "load_config",
]

ENV_CONFIG = "MESHSAGE_CONFIG"
ENV_STATE_DIR = "MESHSAGE_STATE_DIR"
ENV_LLM_BASE_URL = "MESHSAGE_LLM_BASE_URL"
ENV_LLM_MODEL = "MESHSAGE_LLM_MODEL"


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Config:
    """Read, validate and apply environment overrides. ``path=None`` uses MESHSAGE_CONFIG."""
    env = os.environ if env is None else env
    if path is None:
        path = env.get(ENV_CONFIG) or None
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        raw = _read_yaml(Path(path), from_env=path == env.get(ENV_CONFIG))
    for section in ("console", "meshtastic", "meshcore", "discord"):
        if section in raw and raw[section] is None:
            raw[section] = {}  # "meshtastic:" with nothing under it means "on, with defaults"
    raw, env_keys = _apply_env(raw, env)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_explain(source, exc, env_keys)) from None
    config._source = source
    config._env_keys = env_keys
    return config


def _read_yaml(path: Path, *, from_env: bool = False) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if from_env:
            raise ConfigError(
                f"{path}: file not found (environment variable {ENV_CONFIG} names it). Fix: "
                "create it from config.example.yaml (systemd/install.sh writes one); in a "
                "container, mount the directory holding config.yaml, e.g. "
                '-v "$PWD/config:/config:ro".'
            ) from None
        raise ConfigError(
            f"{path}: file not found. Fix: pass an existing file, or copy config.example.yaml "
            "to it, or run without --config to use the defaults."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: cannot read ({exc}). Fix: check permissions/encoding."
        ) from None
    try:
        data = load_unique(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = str(getattr(exc, "problem", exc))
        if "appears twice" in problem:
            raise ConfigError(f"{path}:{where}: {problem}.") from None
        raise ConfigError(
            f"{path}:{where}: not valid YAML ({problem}). Fix: check indentation and quoting there."
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections (llm:, bot:, ...), "
            f"not a {type(data).__name__}. Fix: see config.example.yaml."
        )
    return data


def _apply_env(
    raw: dict[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's values with the environment's on top, and which key each variable set."""
    raw = dict(raw)
    used: dict[str, str] = {}
    if env.get(ENV_STATE_DIR):
        raw["state_dir"] = env[ENV_STATE_DIR]
        used["state_dir"] = ENV_STATE_DIR
    llm_over = {}
    for key, var in (("base_url", ENV_LLM_BASE_URL), ("model", ENV_LLM_MODEL)):
        if env.get(var):
            llm_over[key] = env[var]
            used[f"llm.{key}"] = var
    if llm_over:
        llm = raw.get("llm")
        raw["llm"] = {**(llm if isinstance(llm, dict) else {}), **llm_over}
    return raw, used


def _model_at(path: tuple[int | str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Config
    for part in path:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            continue  # list indexes and union branches do not change the model we look at
        ann = model.model_fields[part].annotation
        model = _first_model(ann)
    return model


def _first_model(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _explain(source: str, exc: ValidationError, env_keys: Mapping[str, str]) -> str:
    lines = [f"{source}: invalid configuration ({exc.error_count()} problem(s)):"]
    for err in exc.errors():
        loc = tuple(
            p for p in err["loc"] if not (isinstance(p, str) and p[:1].isupper())
        )  # drop pydantic's union-branch labels such as 'MeshtasticConfig'
        key = ".".join(str(p) for p in loc) or "(top level)"
        kind = err["type"]
        var = env_keys.get(key)
        if kind == "extra_forbidden":
            parent = _model_at(loc[:-1])
            valid = sorted(parent.model_fields) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            lines.append(
                f"  {key}: unknown key. Fix: {hint}remove it; valid keys here: {', '.join(valid)}"
            )
        elif kind == "missing":
            lines.append(f"  {key}: required. Fix: add it (see config.example.yaml)")
        else:
            got = err.get("input")
            shown = repr(got) if not isinstance(got, dict) else "a mapping"
            need = _plain(kind, err.get("ctx") or {}, err["msg"])
            if var is not None:
                lines.append(
                    f"  {key} (from environment variable {var}): {need} (got {shown}). "
                    f"Fix: change {var} where it is set (the unit's Environment=, "
                    "/etc/meshsage/env, or the container's environment)"
                )
            else:
                lines.append(f"  {key}: {need} (got {shown}). Fix: change {key} in {source}")
    return "\n".join(lines)


def _plain(kind: str, ctx: Mapping[str, Any], msg: str) -> str:
    """The requirement behind a validation error, in words an operator uses."""
    simple = {
        "int_parsing": "must be a whole number, e.g. 3",
        "int_type": "must be a whole number, e.g. 3",
        "int_from_float": "must be a whole number, e.g. 3",
        "float_parsing": "must be a number, e.g. 2.5",
        "float_type": "must be a number, e.g. 2.5",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "string_type": "must be text (put it in quotes)",
        "dict_type": "must be a section: indented key: value lines under it",
        "model_type": "must be a section: indented key: value lines under it",
        "model_attributes_type": "must be a section: indented key: value lines under it",
        "tuple_type": "must be a list, e.g. [1, 2] or one '- item' line per entry",
        "list_type": "must be a list, e.g. [1, 2] or one '- item' line per entry",
        "string_pattern_mismatch": "must be the name of an environment variable, e.g. MY_TOKEN",
        "path_type": "must be a directory path, e.g. /var/lib/meshsage",
    }
    if kind in simple:
        return simple[kind]
    bounds = {
        "greater_than": "must be greater than {gt}",
        "greater_than_equal": "must be {ge} or more",
        "less_than": "must be less than {lt}",
        "less_than_equal": "must be {le} or less",
        "string_too_short": "must be at least {min_length} character(s) long",
        "string_too_long": "must be at most {max_length} characters long",
        "too_short": "must have at least {min_length} item(s)",
        "too_long": "must have at most {max_length} items",
    }
    if kind in bounds:
        shown = {
            k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in ctx.items()
        }
        with contextlib.suppress(KeyError, IndexError):
            return bounds[kind].format(**shown)
    if kind == "literal_error" and "expected" in ctx:
        return f"must be one of {ctx['expected']}"
    if msg.startswith("Input should be "):
        return "must be " + msg.removeprefix("Input should be ").replace("valid ", "")
    return msg.removeprefix("Value error, ").strip()
