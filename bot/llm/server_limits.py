"""What the LLM server holds per request, learned from the server, never assumed.

Where each server says it (checked 2026-11-27 against llama-cpp-python 0.3.36; the others from
their documented APIs):
- llama.cpp's ``llama-server``: ``GET /props`` -> ``default_generation_settings.n_ctx`` (the
  context of one slot) and ``total_slots``.
- Ollama: ``POST /api/show`` -> the model's ``<arch>.context_length`` and the ``num_ctx`` in its
  Modelfile parameters; ``GET /api/ps`` -> ``context_length`` of a loaded model (what it really
  holds) and whether the model is loaded at all (``keep_alive`` unloads it between turns).
  Ollama silently cuts the front of a longer prompt, so with no ``num_ctx`` anywhere its long-
  standing default, ``OLLAMA_DEFAULT_CTX``, is assumed and said so.
- vLLM: ``GET /v1/models`` -> ``max_model_len`` of the model.
- llama-cpp-python's server (a different program) and hosted APIs report nothing; the size is
  then read from their overflow error ("maximum context length is 512 tokens", "context window
  of 512") the first time a prompt is refused, and kept.

Invariants:
- Learning never raises and never blocks long: every look is a plain HTTP GET (one POST to
  Ollama's ``/api/show``, which changes nothing), all at once, bounded by ``timeout``.
- ``budget`` never grows a transport's configured ``context_tokens`` or ``max_tokens``; with
  a learned context it returns the smaller of the config and what the server holds, minus the
  answer's tokens and a ``TOKENIZER_MARGIN`` (our cl100k count runs 4-16% under SmolLM2's).
  Once the server's own counts were heard (``ratio``: its ``usage.prompt_tokens`` per token
  of ours, ``bot.llm.server_record``), the margin is the ratio's, with ``RATIO_SLACK``, when
  that is tighter; and a configured ``context_tokens`` (the operator's window, in the model's
  tokens) is read in ours through it.
- A size read from an overflow error is kept across refreshes of a server that reports
  nothing (it is the only thing that server ever said); a server that reports a size wins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bot.llm.server_record import ServerRecord

log = logging.getLogger("bot.llm.limits")

LEARN_TIMEOUT = 3.0
OLLAMA_DEFAULT_CTX = 2048  # Ollama's num_ctx when nothing sets it (raised to 4096 in newer builds)
TOKENIZER_MARGIN = 0.9  # share of the server's room the prompt may use by our count
RATIO_SLACK = 1.03  # over the largest ratio heard: prompts vary, and so do their ratios
MIN_ANSWER_SHARE = 4  # with a small context, the answer gets at most n_ctx / this
RELEARN_EVERY = 30.0  # a failed look is tried again at most this often

_CTX_IN_ERROR = (
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),  # OpenAI, vLLM, llama-cpp-py
    re.compile(r"context window of (\d+)", re.IGNORECASE),  # llama-cpp-python (raw)
    re.compile(r"context size \((\d+)", re.IGNORECASE),  # llama-server
    re.compile(r"n_ctx\W{1,3}(\d+)", re.IGNORECASE),
)

_PROMPT_IN_ERROR = (
    re.compile(r"\((\d+) in the messages", re.IGNORECASE),  # OpenAI, vLLM, llama-cpp-python
    re.compile(r"request \((\d+) tokens\)", re.IGNORECASE),  # llama-server
    re.compile(r"Requested tokens \((\d+)\)", re.IGNORECASE),  # llama-cpp-python (raw)
)

Fetch = Callable[[str, "bytes | None", float], "Any | None"]
# (prompt tokens wanted, answer tokens wanted) -> what one request may hold on this server.
Room = Callable[[int, int], tuple[int, int]]


def no_limit(prompt: int, answer: int) -> tuple[int, int]:
    """A ``Room`` for a server whose size is not learned: the sizes asked for stand."""
    return prompt, answer


@dataclass(frozen=True, slots=True)
class ServerLimits:
    n_ctx: int | None = None  # tokens one request may hold (prompt + answer)
    slots: int | None = None
    server: str = ""  # "llama.cpp", "Ollama", "vLLM"; "" when nothing answered
    source: str = ""  # where n_ctx came from
    loaded: bool | None = None  # Ollama: the model is in memory now (None: not known)
    note: str = ""  # what else the operator should know
    learned_at: float | None = None

    def describe(self) -> str:
        """One line for doctor, the status file and the start log."""
        if self.n_ctx is None:
            head = "the server reports no context size"
            if self.server:
                head += f" ({self.server})"
            return (
                head
                + "; context_tokens from the config stands"
                + (f"; {self.note}" if self.note else "")
            )
        parts = [f"n_ctx {self.n_ctx} ({self.source})"]
        if self.slots is not None:
            parts.append(f"{self.slots} slot(s)")
        if self.loaded is False:
            parts.append("model not loaded now (keep_alive): the next reply pays a load")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)


def budget(
    limits: ServerLimits, *, context_tokens: int, max_tokens: int, ratio: float | None = None
) -> tuple[int, int]:
    """(prompt tokens, answer tokens) for one request: the config's, or less when the server
    holds less. The answer keeps its configured size unless that would take more than
    1/``MIN_ANSWER_SHARE`` of a small context. ``ratio``: the server's tokens per token of
    ours, as heard (None: not heard yet)."""
    margin = TOKENIZER_MARGIN
    if ratio is not None and ratio > 1:
        context_tokens = max(1, int(context_tokens / (ratio * RATIO_SLACK)))
        margin = min(margin, 1 / (ratio * RATIO_SLACK))
    if limits.n_ctx is None:
        return context_tokens, max_tokens
    answer = min(max_tokens, max(16, limits.n_ctx // MIN_ANSWER_SHARE))
    room = int((limits.n_ctx - answer) * margin)
    return max(1, min(context_tokens, room)), answer


def ctx_from_error(message: str) -> int | None:
    """The context size a server names in its overflow error, if it names one."""
    for pattern in _CTX_IN_ERROR:
        if m := pattern.search(message):
            n = int(m.group(1))
            if 64 <= n <= 10_000_000:
                return n
    return None


def prompt_from_error(message: str) -> int | None:
    """The prompt's size by the server's own count, when its overflow error says it."""
    for pattern in _PROMPT_IN_ERROR:
        if m := pattern.search(message):
            return int(m.group(1))
    return None


def root_url(base_url: str) -> str:
    """``http://host:8080`` for ``http://host:8080/v1`` (the native APIs live at the root)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def fetch_json(url: str, data: bytes | None, timeout: float) -> Any | None:
    """The JSON a URL answers with (POST when ``data``), or None for anything else."""
    request = urllib.request.Request(
        url,
        data=data,
        headers={"User-Agent": "meshsage-limits", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read(1_000_000))
    except (urllib.error.URLError, OSError, ValueError):
        return None


async def learn(
    *, base_url: str, model: str, timeout: float = LEARN_TIMEOUT, fetch: Fetch = fetch_json
) -> ServerLimits:
    """Ask the server what it holds (see the module docstring); never raises."""
    root = root_url(base_url)
    body = json.dumps({"model": model}).encode()

    async def get(url: str, data: bytes | None = None) -> Any | None:
        try:
            async with asyncio.timeout(timeout + 0.5):
                return await asyncio.to_thread(fetch, url, data, timeout)
        except TimeoutError:
            return None

    props, show, ps, models = await asyncio.gather(
        get(f"{root}/props"),
        get(f"{root}/api/show", body),
        get(f"{root}/api/ps"),
        get(base_url.rstrip("/") + "/models"),
    )
    now = time.time()
    if found := _from_props(props):
        return replace(found, learned_at=now)
    if found := _from_ollama(show, ps, model):
        return replace(found, learned_at=now)
    if found := _from_models(models, model):
        return replace(found, learned_at=now)
    answered = models is not None
    return ServerLimits(
        note="" if answered else "the server did not answer",
        learned_at=now if answered else None,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _from_props(props: Any) -> ServerLimits | None:
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    n_ctx = n_ctx or _int(props.get("n_ctx"))
    if n_ctx is None:
        return None
    return ServerLimits(
        n_ctx=n_ctx, slots=_int(props.get("total_slots")), server="llama.cpp", source="/props"
    )


def _from_ollama(show: Any, ps: Any, model: str) -> ServerLimits | None:
    if not isinstance(show, dict) or not ("model_info" in show or "parameters" in show):
        return None
    info = show.get("model_info")
    trained = None
    if isinstance(info, dict):
        trained = next(
            (_int(v) for k, v in info.items() if k.endswith(".context_length") and _int(v)), None
        )
    num_ctx = None
    m = re.search(r"^\s*num_ctx\s+(\d+)", str(show.get("parameters") or ""), re.MULTILINE)
    if m:
        num_ctx = int(m.group(1))
    loaded_ctx: int | None = None
    loaded: bool | None = None
    if isinstance(ps, dict) and isinstance(ps.get("models"), list):
        loaded = False
        for entry in ps["models"]:
            if isinstance(entry, dict) and model in (entry.get("name"), entry.get("model")):
                loaded = True
                loaded_ctx = _int(entry.get("context_length"))
    of_model = f"; the model holds {trained}" if trained else ""
    if loaded_ctx:
        n_ctx, source = loaded_ctx, "Ollama /api/ps, the loaded model's context"
    elif num_ctx:
        n_ctx, source = num_ctx, "Ollama num_ctx in /api/show"
    else:
        n_ctx = min(OLLAMA_DEFAULT_CTX, trained or OLLAMA_DEFAULT_CTX)
        source = "Ollama's default num_ctx; nothing sets it"
        of_model += " (set num_ctx in a Modelfile or OLLAMA_CONTEXT_LENGTH for more)"
    return ServerLimits(n_ctx=n_ctx, server="Ollama", source=source + of_model, loaded=loaded)


def _from_models(models: Any, model: str) -> ServerLimits | None:
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return None
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") == model:
            n = _int(entry.get("max_model_len"))
            if n is not None:
                return ServerLimits(n_ctx=n, server="vLLM", source="/v1/models max_model_len")
    return None


class LearnedLimits:
    """The limits as last learned, refreshed at start, after the connection was lost, and
    when a prompt overflows (a server restarted with a smaller context says so only then)."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        timeout: float = LEARN_TIMEOUT,
        fetch: Fetch = fetch_json,
        clock: Callable[[], float] = time.monotonic,
        record: ServerRecord | None = None,
    ) -> None:
        self._record = record  # the server's token counts, heard by the adapter
        self._base_url = base_url
        self._model = model
        self._timeout = timeout
        self._fetch = fetch
        self._clock = clock
        self.current = ServerLimits()
        self._stale = True
        self._tried_at: float | None = None
        self._from_error: ServerLimits | None = None
        self._lock = asyncio.Lock()
        self.cold_loads = 0  # replies that found the model unloaded (Ollama keep_alive)
        self.last_cold_load: float | None = None

    def mark_stale(self) -> None:
        """The connection was lost (a restart may have changed the server): look again at
        the next turn, but not more often than ``RELEARN_EVERY`` while it stays away (each
        look at a host that does not answer costs its timeout)."""
        self._stale = True

    async def refresh(self) -> ServerLimits:
        async with self._lock:
            self._tried_at = self._clock()
            found = await learn(
                base_url=self._base_url, model=self._model, timeout=self._timeout,
                fetch=self._fetch,
            )  # fmt: skip
            if found.n_ctx is None and self._from_error is not None and found.learned_at:
                found = replace(self._from_error, learned_at=found.learned_at)
            if found.learned_at is not None:
                self._stale = False
            first = self.current.learned_at is None and found.learned_at is not None
            if first or (found.n_ctx, found.source) != (self.current.n_ctx, self.current.source):
                log.info("LLM server limits: %s", found.describe())
            self.current = found
            return found

    async def ensure(self) -> ServerLimits:
        """The current limits, looked up again first when stale (at most every
        ``RELEARN_EVERY`` seconds while the server does not answer)."""
        if self._stale and (
            self._tried_at is None or self._clock() - self._tried_at >= RELEARN_EVERY
        ):
            await self.refresh()
        return self.current

    def token_ratio(self) -> float | None:
        """The server's prompt tokens per token of ours, as heard (None: not yet)."""
        if self._record is None:
            return None
        return self._record.token_ratio(self._base_url, self._model)

    def budget(self, *, context_tokens: int, max_tokens: int) -> tuple[int, int]:
        """``budget`` with what was last learned and the token ratio heard."""
        return budget(
            self.current, context_tokens=context_tokens, max_tokens=max_tokens,
            ratio=self.token_ratio(),
        )  # fmt: skip

    def room(self, prompt: int, answer: int) -> tuple[int, int]:
        """A ``Room``: (prompt, answer) tokens for background work (chapters, merges, facts,
        session summaries) from what was last learned; never looks it up (background work
        must not wait on the network)."""
        return self.budget(context_tokens=prompt, max_tokens=answer)

    def heard_overflow(self, server_message: str) -> ServerLimits:
        """A server refused a prompt as too long: keep the size its words name, if any."""
        n = ctx_from_error(server_message)
        if n is not None and n != self.current.n_ctx:
            learned = ServerLimits(
                n_ctx=n,
                slots=self.current.slots,
                server=self.current.server,
                source="named in the server's overflow error",
                learned_at=time.time(),
            )
            self._from_error = learned
            self.current = learned
            log.info("LLM server limits: %s", learned.describe())
        return self.current

    async def check_loaded(self) -> bool | None:
        """Ollama only: is the model in memory now? A reply that finds it unloaded pays a
        load (seconds to minutes on a Pi); that is counted, and is not an outage."""
        if self.current.server != "Ollama":
            return None
        ps = await asyncio.to_thread(
            self._fetch, root_url(self._base_url) + "/api/ps", None, min(self._timeout, 1.0)
        )
        if not isinstance(ps, dict) or not isinstance(ps.get("models"), list):
            return None
        loaded = any(
            isinstance(e, dict) and self._model in (e.get("name"), e.get("model"))
            for e in ps["models"]
        )
        if not loaded:
            self.cold_loads += 1
            self.last_cold_load = time.time()
            log.info("model %s is not loaded (Ollama keep_alive unloaded it): this reply "
                     "waits for the load; not an outage", self._model)  # fmt: skip
        self.current = replace(self.current, loaded=True)  # this reply loads it
        return loaded

    def describe_ratio(self) -> str:
        """The token ratio heard, for the status ("" until heard)."""
        ratio = self.token_ratio()
        if ratio is None or self._record is None:
            return ""
        n = self._record.ratio_samples(self._base_url, self._model)
        return (
            f"token ratio {ratio:.2f} (the server counts {ratio - 1:+.0%} against our cl100k "
            f"count, {n} sample(s); budgets follow it)"
        )

    def describe(self) -> str:
        line = self.current.describe()
        if ratio := self.describe_ratio():
            line += f"; {ratio}"
        if self.cold_loads and self.last_cold_load is not None:
            when = time.strftime("%H:%M", time.localtime(self.last_cold_load))
            line += (
                f"; {self.cold_loads} reply(ies) waited for a model load after keep_alive "
                f"unloaded it (last {when}; not an outage)"
            )
        return line
