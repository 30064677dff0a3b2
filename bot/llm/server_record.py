"""What the bot learned about each LLM server and model, kept in the state dir across restarts.

Two things only a server's own answers tell, each costly to learn again at every start:
- the structured-output mode it takes (``bot.llm.structured``): llama-cpp-python answers
  HTTP 500 to ``json_schema``; once learned, a restart asks in the mode that works at once;
- how its tokenizer counts against ours: the ratio of its ``usage.prompt_tokens`` to our cl100k
  count of the same messages (SmolLM2 counts 14-16% more), so budgets leave room for it.

Invariants:
- Keyed by (base_url, model): another server or another model starts from nothing.
- Holds no prompt text: modes and numbers only.
- A missing or damaged file is an empty record (a warning says so); reading never raises.
  Writes replace the file atomically (a temporary file renamed over it) and happen only when
  what is known changed; a failed write is logged and the bot goes on with what it holds.
- A ratio is a sample only when our count is at least ``MIN_RATIO_TOKENS`` (short prompts are
  mostly template, which would exaggerate it); the ratio used is the largest of the last
  ``RATIOS_KEPT`` samples (a budget must hold for the chattiest prompt seen, not the average).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("bot.llm.record")

RECORD_FILE = "llm_servers.json"
MIN_RATIO_TOKENS = 200
RATIOS_KEPT = 8
RATIO_SETTLED = 3  # samples after which the ratio is no longer asked for on its own


@dataclass
class _Entry:
    structured: str | None = None
    ratios: list[float] = field(default_factory=list)


class ServerRecord:
    """The learned facts per server and model (``path`` None: kept in memory only)."""

    def __init__(self, *, path: Path | None) -> None:
        self._path = path
        self._entries: dict[str, _Entry] = {}
        if path is not None:
            self._entries = _load(path)

    @staticmethod
    def _key(base_url: str, model: str) -> str:
        return f"{base_url.rstrip('/')}|{model}"

    def _entry(self, base_url: str, model: str) -> _Entry:
        return self._entries.setdefault(self._key(base_url, model), _Entry())

    def structured_mode(self, base_url: str, model: str) -> str | None:
        entry = self._entries.get(self._key(base_url, model))
        return entry.structured if entry is not None else None

    def set_structured_mode(self, base_url: str, model: str, mode: str) -> None:
        entry = self._entry(base_url, model)
        if entry.structured != mode:
            entry.structured = mode
            self._save()

    def heard_usage(self, base_url: str, model: str, *, ours: int, theirs: int) -> None:
        """The server counted ``theirs`` prompt tokens where we counted ``ours``."""
        if ours < MIN_RATIO_TOKENS or theirs <= 0:
            return
        entry = self._entry(base_url, model)
        before = max(entry.ratios, default=None)
        entry.ratios = [*entry.ratios, round(theirs / ours, 4)][-RATIOS_KEPT:]
        after = max(entry.ratios)
        if len(entry.ratios) <= RATIO_SETTLED or before is None or abs(after - before) > 0.005:
            self._save()

    def token_ratio(self, base_url: str, model: str) -> float | None:
        """Server tokens per token of ours (the largest recent sample), None until heard."""
        entry = self._entries.get(self._key(base_url, model))
        return max(entry.ratios) if entry is not None and entry.ratios else None

    def ratio_samples(self, base_url: str, model: str) -> int:
        entry = self._entries.get(self._key(base_url, model))
        return len(entry.ratios) if entry is not None else 0

    def ratio_settled(self, base_url: str, model: str) -> bool:
        return self.ratio_samples(base_url, model) >= RATIO_SETTLED

    def _save(self) -> None:
        if self._path is None:
            return
        doc = {
            key: {"structured": e.structured, "ratios": e.ratios}
            for key, e in sorted(self._entries.items())
        }
        tmp = self._path.with_name(self._path.name + ".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, self._path)
        except OSError as exc:
            log.warning("could not keep what was learned about the LLM server in %s (%s); it "
                        "is learned again after a restart. Fix: make the state dir writable",
                        self._path, exc)  # fmt: skip


def _load(path: Path) -> dict[str, _Entry]:
    try:
        doc: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s): what the bot learned about its LLM servers is "
                    "learned again (the file is rewritten)", path, exc)  # fmt: skip
        return {}
    entries: dict[str, _Entry] = {}
    if not isinstance(doc, dict):
        return entries
    for key, value in doc.items():
        if not isinstance(key, str) or not isinstance(value, dict):
            continue
        mode = value.get("structured")
        ratios = value.get("ratios")
        entries[key] = _Entry(
            structured=mode if isinstance(mode, str) else None,
            ratios=[
                float(r)
                for r in (ratios if isinstance(ratios, list) else [])
                if isinstance(r, int | float) and 0.2 < r < 5
            ][-RATIOS_KEPT:],
        )
    return entries
