"""Is anything listening at the LLM URL? A short plain HTTP look, no completion.

Used by ``meshsage chat`` at start (in the background, so the prompt is not delayed) and by
``doctor`` (an Ollama root that answers while ``/v1`` does not: "base_url should end in /v1").

Invariants: any HTTP answer, even 401 or 404, means a server listens; only a refused or
timed-out connection is "unreachable". Nothing is sent but a GET.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Callable

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


async def warn_if_unreachable(
    base_url: str, say: Callable[[str], None], *, timeout: float = PROBE_TIMEOUT
) -> None:
    """Print one plain line when nothing answers at ``base_url`` (or it lacks /v1)."""
    models = base_url.rstrip("/") + "/models"
    status, reason = await asyncio.to_thread(http_status, models, timeout=timeout)
    if status == 0:
        say(
            f"meshsage: nothing answers at {base_url} ({reason}); answers will fail until it "
            "does. Fix: start the LLM server (Ollama: sudo systemctl start ollama, or `ollama "
            "serve`), or set llm.base_url / MESHSAGE_LLM_BASE_URL to where it runs."
        )
    elif status == 404 and await asyncio.to_thread(missing_v1, base_url, timeout=timeout):
        say(f"meshsage: {base_url} answers, but the API is under /v1. Fix: {v1_fix(base_url)}")


def v1_fix(base_url: str) -> str:
    return (
        f"base_url should end in /v1: set llm.base_url: {base_url.rstrip('/')}/v1 "
        "(or MESHSAGE_LLM_BASE_URL)"
    )
