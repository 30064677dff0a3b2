"""The one check of everything ``run`` would refuse, shared by ``check-config``, ``run``,
``chat`` and ``doctor``.

Invariants:
- Pure inspection: nothing is created, opened for writing or sent over the network.
- Every problem names its source (``FILE: key`` or the environment variable) and the fix in
  plain words; all problems are reported together in one ``ConfigError`` (exit status 2, which
  the systemd unit does not restart: a restart cannot fix a config).
- A service with nothing to do is a problem: every transport disabled, or the console as the
  only transport while stdin is not a terminal (systemd, a container), unless the caller pipes
  a script in on purpose (``meshsage chat < file``).
- ``check-config --for chat`` and ``doctor --for chat`` judge a config as ``meshsage chat``
  uses it (``for_chat``: the console alone, piped input allowed), so a script or CI can check
  a chat config; without ``--for`` they judge it as ``run`` would here (the service's rule).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bot.config import Config, default_state_dir
from bot.errors import ConfigError
from bot.urls import redact

_EXTRAS = {"meshtastic": "meshtastic", "meshcore": "meshcore", "discord": "discord"}
TARGETS = ("service", "chat")  # check-config/doctor --for


def for_chat(chat: bool) -> dict[str, Any]:
    """The arguments of ``problems``/``check`` that judge a config as ``meshsage chat`` uses
    it (``chat``), or none (as ``run`` would)."""
    return {"only": ["console"], "scripted_console": True} if chat else {}


def describe(config: Config, *, chat: bool = False) -> str:
    """What a passed config runs, in one phrase: its transports and its store."""
    if chat:
        return f"for `meshsage chat`: the console; {describe_store(config)}"
    return f"transports: {', '.join(config.enabled_transports())}; {describe_store(config)}"


def problems(
    config: Config,
    *,
    env: Mapping[str, str],
    interactive: bool,
    only: Sequence[str] | None = None,
    scripted_console: bool = False,
) -> list[str]:
    """Everything that would stop ``run`` (or ``chat`` with ``only=["console"]``)."""
    found: list[str] = []
    names = list(only) if only is not None else config.enabled_transports()
    src = config.source
    if not names:
        found.append(
            f"{src}: every transport is disabled (enabled: false), so the bot would have nothing "
            "to do. Fix: enable meshtastic: or discord: (or console: for a terminal chat)."
        )
    if names == ["console"] and not interactive and not scripted_console:
        if src == "<defaults>":
            where = "no config file, so the only transport is the console"
        else:
            where = f"{src}: the only transport is the console"
        found.append(
            f"{where}, and stdin is not a terminal (a service or container has none), so the "
            "bot would read end-of-input and stop at once. Fix: add a meshtastic: or discord: "
            "section (systemd/install.sh writes one), or chat in a terminal with `meshsage "
            "chat`; to pipe messages in, use `meshsage chat < file` (`meshsage check-config --for "
            "chat` judges a config for that)."
        )
    if "meshtastic" in names and config.meshtastic is not None:
        link = config.meshtastic.link_problem()
        if link is not None:
            found.append(f"{src}: {link}")
    if "meshcore" in names and config.meshcore is not None:
        link = config.meshcore.link_problem()
        if link is not None:
            found.append(f"{src}: {link}")
    if "discord" in names and config.discord is not None:
        var = config.discord.token_env
        if not env.get(var, "").strip():
            found.append(
                f"{src}: discord: is enabled but the environment variable {var} (discord.token_env)"
                " is not set. Fix: put the bot token in it (systemd: /etc/meshsage/env, "
                f"`{var}=...`; container: --env-file), or disable the discord: section."
            )
    for name in names:
        module = _EXTRAS.get(name)
        if module is not None and not installed(module):
            found.append(
                f"{src}: {name}: needs the {module} package, which is not installed. Fix: "
                f"pip install 'meshsage[{name}]' (or meshsage[all]), or remove the {name}: section."
            )
    if config.memory.embeddings.enabled and not installed("numpy"):
        found.append(
            f"{src}: memory.embeddings is enabled but numpy is not installed. Fix: "
            "pip install 'meshsage[embeddings]', or set memory.embeddings.enabled: false."
        )
    if config.relay.pairs and only is None:
        found += _relay_problems(config, names)
    found += storage_problems(config, env=env)
    if only is None:  # `run` serves the web view; chat and the memory tools do not
        from bot.web.checks import web_problems

        found += web_problems(config, env=env)
    state = state_dir_problem(config.state_dir or default_state_dir())
    if state is not None:
        origin = config.origin("state_dir") if config.state_dir else "the default state dir"
        found.append(f"{origin}: {state}")
    return found


def _relay_problems(config: Config, names: Sequence[str]) -> list[str]:
    """``relay: pairs`` join the two sides: both must be configured and enabled."""
    missing = []
    for side in ("meshtastic", "discord"):
        if getattr(config, side) is None:
            missing.append(f"there is no {side}: section")
        elif side not in names:
            missing.append(f"{side}: is disabled (enabled: false)")
    if not missing:
        return []
    return [
        f"{config.source}: relay: pairs need both the meshtastic: and the discord: sections "
        f"enabled, but {' and '.join(missing)}. Fix: configure and enable both, or remove the "
        "relay: pairs."
    ]


def storage_problems(config: Config, *, env: Mapping[str, str]) -> list[str]:
    """What would stop the store from opening that the config and environment already tell:
    the password variable, the asyncpg extra, an SQLite file's directory."""
    src = config.source
    storage = config.storage
    found: list[str] = []
    if storage.postgres:
        var = storage.password_env
        if var is not None and env.get(var) is None:
            found.append(
                f"{src}: storage.password_env names {var}, which is not set. Fix: set it "
                f"(systemd: /etc/meshsage/env, `{var}=...`; container: --env-file), or remove "
                "password_env if the server needs no password."
            )
        if not installed("asyncpg"):
            found.append(
                f"{src}: storage.url is a postgresql:// store, which needs asyncpg, and it is "
                "not installed. Fix: pip install 'meshsage[postgres]' (install.sh: "
                "--postgres), or leave storage.url out for SQLite."
            )
    elif storage.url is not None:
        folder = config.database_path.parent
        if folder != (config.state_dir or default_state_dir()):
            problem = state_dir_problem(folder)
            if problem is not None:
                found.append(f"{src}: storage.url: {problem}")
    return found


def installed(module: str) -> bool:
    """Whether ``import module`` can work (a module set to None in sys.modules cannot)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def describe_store(config: Config) -> str:
    """The store in one phrase, never with a password: "database: FILE" or "store: URL"."""
    if config.storage.postgres:
        return f"store: PostgreSQL {redact(config.storage.url or '')}"
    return f"database: {config.database_path}"


def check(
    config: Config,
    *,
    env: Mapping[str, str],
    interactive: bool,
    only: Sequence[str] | None = None,
    scripted_console: bool = False,
) -> None:
    """Raise one ``ConfigError`` listing every problem ``problems`` finds."""
    found = problems(
        config, env=env, interactive=interactive, only=only, scripted_console=scripted_console
    )
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigError(
            f"{len(found)} problems would stop the bot:\n" + "\n".join(f"  - {p}" for p in found)
        )


def state_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot hold the database (None when it can, or can be created)."""
    fix = (
        "Fix: point state_dir (or MESHSAGE_STATE_DIR) at a directory this user can write, "
        "e.g. /var/lib/meshsage or ~/.local/share/meshsage."
    )
    if path.exists():
        if not path.is_dir():
            return f"{path} is not a directory. {fix}"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"the state directory {path} is not writable by this user. {fix}"
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot create the state directory {path}: {parent} is not a directory. {fix}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create the state directory {path}: {parent} is not writable. {fix}"
    return None
