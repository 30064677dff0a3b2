"""What stops the web view from starting, told before anything starts (``check-config``,
``run``'s preflight, ``doctor``), and the token it is guarded by.

Invariants:
- Pure inspection: no socket is opened here; the port being taken is found (and told, with
  the fix) when the server binds.
- A bind beyond the loopback without ``token_env`` is refused by the config schema; here the
  named variable must be set to a token of at least ``MIN_TOKEN_CHARS`` characters, or the bot
  refuses to start. The token's value never appears in a message.
- A configured token guards every page, on the loopback too.
- ``web_address`` is what ``meshsage status`` and the run log say about the view: its address,
  or why there is none and how to get one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from bot.config import Config

MIN_TOKEN_CHARS = 16


def web_token(config: Config, env: Mapping[str, str]) -> str | None:
    """The token the pages need, or None (loopback without ``token_env``)."""
    var = config.web.token_env
    if var is None:
        return None
    return env.get(var, "").strip() or None


def web_problems(config: Config, *, env: Mapping[str, str]) -> list[str]:
    web = config.web
    if not web.enabled:
        return []
    src = config.source
    found: list[str] = []
    if importlib.util.find_spec("aiohttp") is None:
        found.append(
            f"{src}: web: is enabled but aiohttp is not installed. Fix: pip install "
            "'meshsage[web]' (install.sh: --web), or set web.enabled: false."
        )
    var = web.token_env
    if var is not None:
        token = env.get(var, "").strip()
        where = "loopback only, but guarded" if web.loopback else f"bind {web.bind}"
        if not token:
            found.append(
                f"{src}: web.token_env names {var}, which is not set ({where}). Fix: put "
                f"{var}=<a long random string, e.g. from `openssl rand -hex 24`> in the env "
                "file (systemd: /etc/meshsage/env; container: --env-file)."
            )
        elif len(token) < MIN_TOKEN_CHARS:
            found.append(
                f"{src}: the web token in {var} is {len(token)} characters; at least "
                f"{MIN_TOKEN_CHARS} are needed. Fix: use a long random string (`openssl rand "
                "-hex 24`)."
            )
    return found


def web_address(config: Config, serving: str | None) -> str:
    """``serving``: the running view's address (``WebServer.address``), None if none runs."""
    if serving is not None:
        return serving
    if config.web.enabled:
        return "not serving (the reason was logged at start)"
    return f"off (web: enabled: true serves it at http://127.0.0.1:{config.web.port}/)"
