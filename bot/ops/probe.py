"""Is anything listening at the LLM URL, with the model? A short plain HTTP look, no completion.

Used by ``meshsage chat`` and ``meshsage run`` at start (in the background, so nothing waits
for it; chat prints the line, run logs it) and by ``doctor`` (an Ollama root that answers
while ``/v1`` does not: "base_url should end in /v1").

Invariants: any HTTP answer, even 401 or 404, means a server listens; only a refused or
timed-out connection is "unreachable". Nothing is sent but a GET. At most one line is said,
and it names the fix: start the server, add ``/v1``, or pull the model (a server whose
``/models`` lists models but not this one).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

PROBE_TIMEOUT = 3.0


def http_status(url: str, *, timeout: float = PROBE_TIMEOUT) -> tuple[int, str]:
    """(HTTP status, "") for any answer; (0, reason) when nothing answered."""
    request = urllib.request.Request(url, headers={"User-Agent": "meshsage-probe"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, str(getattr(reason, "strerror", None) or reason)


def root_of(base_url: str) -> str | None:
    """``http://host:11434`` for ``http://host:11434/`` (a base URL with no path), else None."""
    scheme, sep, rest = base_url.partition("://")
    host, _, path = rest.partition("/")
    if not sep or path.strip("/"):
        return None
    return f"{scheme}://{host}"


def missing_v1(base_url: str, *, timeout: float = PROBE_TIMEOUT) -> bool:
    """True when ``base_url`` has no path, its ``/v1/models`` answers and its ``/models`` does
    not (Ollama and most OpenAI-compatible servers serve the API under /v1)."""
    root = root_of(base_url)
    if root is None:
        return False
    plain, _ = http_status(f"{root}/models", timeout=timeout)
    if 200 <= plain < 300:
        return False
    v1, _ = http_status(f"{root}/v1/models", timeout=timeout)
    return 200 <= v1 < 300


def listed_models(url: str, *, timeout: float = PROBE_TIMEOUT) -> list[str] | None:
    """The model ids an OpenAI-style ``/models`` lists; None when it lists none or is not
    that (some servers have no list: then nothing can be said about the model)."""
    request = urllib.request.Request(url, headers={"User-Agent": "meshsage-probe"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            doc = json.loads(resp.read(1_000_000))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    ids = [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]
    return ids or None


async def warn_if_unreachable(
    base_url: str,
    say: Callable[[str], None],
    *,
    model: str | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> None:
    """Say one plain line when nothing answers at ``base_url``, it lacks /v1, or (with
    ``model``) its model list lacks the model."""
    models = base_url.rstrip("/") + "/models"
    status, reason = await asyncio.to_thread(http_status, models, timeout=timeout)
    if status == 0:
        say(
            f"meshsage: nothing answers at {base_url} ({reason}); answers will fail until it "
            "does. Fix: start the LLM server (Ollama: sudo systemctl start ollama, or `ollama "
            "serve`), or set llm.base_url / MESHSAGE_LLM_BASE_URL to where it runs."
        )
    elif status == 404 and await asyncio.to_thread(missing_v1, base_url, timeout=timeout):
        say(f"meshsage: {base_url} answers HTTP 404: the API is under /v1. Fix: {v1_fix(base_url)}")
    elif status == 200 and model is not None:
        have = await asyncio.to_thread(listed_models, models, timeout=timeout)
        if have is not None and model not in have:
            say(
                f"meshsage: {base_url} has no model {model!r} (it has: {', '.join(have[:8])}); "
                f"answers will fail. Fix: pull it (Ollama: ollama pull {model}) or set "
                "llm.model / MESHSAGE_LLM_MODEL to one it has."
            )


def v1_fix(base_url: str) -> str:
    return (
        f"base_url should end in /v1: set llm.base_url: {base_url.rstrip('/')}/v1 "
        "(or MESHSAGE_LLM_BASE_URL)"
    )


def is_local(base_url: str) -> bool:
    """A server on this machine or the local network (loopback, private or link-local
    addresses, ``localhost``, ``*.local``/``*.lan``/``*.home.arpa``, a bare name such as a
    compose service ``ollama``): such servers (Ollama, llama.cpp, vLLM) need no API key."""
    host = (urlsplit(base_url).hostname or "").lower()
    if not host:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return (
            host == "localhost"
            or host.endswith((".localhost", ".local", ".lan", ".home.arpa", ".internal"))
            or "." not in host
        )
    return ip.is_loopback or ip.is_link_local or any(ip in net for net in _LAN)


# RFC 1918 and IPv6 unique-local (ipaddress's is_private also counts documentation ranges)
_LAN = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
