"""Reading every export format back: JSON and JSONL whole, Markdown with what it cannot carry.

Invariants:
- ``read_export`` tells the format from the file's content (not its name) and returns a
  document that ``export.validate`` accepted, so the import that follows is the JSON one: one
  transaction, all or nothing.
- JSON and JSONL (with each line's ``meshsage`` record) lose nothing:
  JSON -> JSONL -> import -> JSON gives the same bytes.
- Markdown is a transcript: what it does not show is listed in ``Imported.lost``, word for word
  what the operator is told (``MARKDOWN_LOSES``); nothing lost is made up beyond a stated rule.
- Mermaid holds the reply graph with labels cut at 40 characters: it is refused, saying so.
- A JSONL or Markdown file that lacks what a reader needs (a fine-tuning file without the
  ``meshsage`` record, a transcript without roles) is refused with the fix, never guessed at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.llm.tokens import EstimateCounter
from bot.memory.export import FORMAT, ImportFileError, read_bytes, validate

MARKDOWN_LOSES = (
    "message ids of conversations and message platform ids, reply links, token counts "
    "(estimated again), delivery states, use counts and important marks",
    "times below the second; a session's start and end (its first and last message's), a "
    "summary's date (its last message's), the long-term summary's coverage (every session)",
    "a fact's first date when it was revised (the newest is kept), the messages a fact you "
    "pinned came from, !reset points and incognito",
)
_HEAD = re.compile(r"# meshsage export for (.+) \(([^()]+)\)")
_MESSAGE = re.compile(r"\*\*(.*?)\*\* \((\S+), (user|assistant) #(\d+)\): ?(.*)")
_OLD_MESSAGE = re.compile(r"\*\*(.*?)\*\* \((\d{4}-\d\d-\d\dT[^)]*)\): ")
_FACT = re.compile(r"- (.*) \((pinned|from messages \[[\d, ]*\]), (\S+)\)")
_BEFORE = re.compile(
    r"  - before: (.*) \((yours|inferred from messages \[[\d, ]*\]), until (\S+)\)"
)
_ROLLING = re.compile(r"Rolling summary \(messages (\d+)-(\d+)\): (.*)")
_SESSION = re.compile(r"### \d{4}-\d\d-\d\d: (.*)")
_COUNT = EstimateCounter()


@dataclass(frozen=True, slots=True)
class Imported:
    doc: dict[str, Any]
    fmt: str
    lost: tuple[str, ...] = ()  # what the format could not carry, as the operator is told


def read_export(path: Path) -> Imported:
    """Read a JSON, JSONL or Markdown export and validate it (``ImportFileError`` otherwise)."""
    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFileError(f"{path} is not text ({exc}). Fix: import a file "
                              "`meshsage export` wrote.") from None  # fmt: skip
    source = str(path)
    start = text.lstrip()[:200]
    if start.startswith("graph TD"):
        raise ImportFileError(
            f"{source} is a Mermaid export: it holds only the reply graph, each message cut to "
            "40 characters, without dates or facts, so it cannot be imported (Mermaid is "
            "write-only). Fix: import the JSON, JSONL or Markdown export instead."
        )
    if start.startswith("# meshsage export for"):
        return Imported(validate(_markdown(text, source), source=source), "md", MARKDOWN_LOSES)
    if start.startswith("{"):
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            doc = None  # several lines: JSONL
        if isinstance(doc, dict) and "meshsage" not in doc and "messages" not in doc:
            return Imported(validate(doc, source=source), "json")
        return Imported(validate(_jsonl(text, source), source=source), "jsonl")
    raise ImportFileError(
        f"{source} is not a meshsage export (JSON, JSONL or Markdown). Fix: import the file "
        "`meshsage export PERSON --format json` wrote."
    )


# --- JSONL --------------------------------------------------------------------------------------
def _jsonl(text: str, source: str) -> dict[str, Any]:
    """Join the lines' ``meshsage`` parts into one document, rows in id order."""
    doc: dict[str, Any] | None = None
    convs: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ImportFileError(f"{source} line {n} is not JSON ({exc}). Nothing was "
                                  "written.") from None  # fmt: skip
        part = row.get("meshsage") if isinstance(row, dict) else None
        if not isinstance(part, dict):
            raise ImportFileError(
                f'{source} line {n} has no "meshsage" record: a plain fine-tuning file (one '
                "written by an older meshsage, or by another tool) holds roles and text only, "
                "no person, transport, dates, ids, sessions or facts, so it cannot be imported. "
                "Fix: export again with `meshsage export PERSON --format jsonl` (or json). "
                "Nothing was written."
            )
        head = {k: part.get(k) for k in ("format", "version", "transport", "person")}
        if doc is None:
            doc = {**head, "conversations": []}
        elif any(doc[k] != v for k, v in head.items()):
            raise ImportFileError(f"{source} line {n} belongs to another export (format, "
                                  "person or transport differ). Nothing was written.")  # fmt: skip
        parts = part.get("conversations")
        if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
            raise ImportFileError(f'{source} line {n}: "conversations" must be a list of '
                                  "objects. Nothing was written.")  # fmt: skip
        for p in parts:
            _join(convs, p, doc, f"{source} line {n}")
    if doc is None:
        raise ImportFileError(f"{source} is empty. Nothing was written.")
    for conv in doc["conversations"]:
        for table in ("messages", "summaries", "sessions", "facts"):
            conv[table].sort(key=lambda r: r.get("id", 0) if isinstance(r, dict) else 0)
        conv.setdefault("longterm_summary", None)
    return doc


def _join(convs: dict[int, dict[str, Any]], part: dict[str, Any], doc: dict[str, Any],
          where: str) -> None:  # fmt: skip
    cid = part.get("id")
    if not isinstance(cid, int):
        raise ImportFileError(f"{where}: a conversation without an id. Nothing was written.")
    conv = convs.get(cid)
    if conv is None:
        conv = convs[cid] = {k: v for k, v in part.items() if k != "longterm_summary"}
        for table in ("messages", "summaries", "sessions", "facts"):
            conv[table] = list(part.get(table) or [])
        doc["conversations"].append(conv)
    else:
        for table in ("messages", "summaries", "sessions", "facts"):
            rows = part.get(table) or []
            conv[table] += rows if isinstance(rows, list) else [rows]
    if "longterm_summary" in part:
        conv["longterm_summary"] = part["longterm_summary"]


# --- Markdown -----------------------------------------------------------------------------------
def _markdown(text: str, source: str) -> dict[str, Any]:
    """The transcript ``export._markdown`` writes, read line by line (MARKDOWN_LOSES)."""
    lines = text.split("\n")
    head = _HEAD.fullmatch(lines[0].strip())
    if head is None:
        raise ImportFileError(f"{source}: the first line must be '# meshsage export for "
                              "PERSON (TRANSPORT)'. Nothing was written.")  # fmt: skip
    reader = _MarkdownReader(source)
    for n, line in enumerate(lines[1:], 2):
        reader.line(n, line)
    convs = reader.finish()
    return {"format": FORMAT, "version": 1, "transport": head[2], "person": head[1],
            "conversations": convs}  # fmt: skip


class _MarkdownReader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.convs: list[dict[str, Any]] = []
        self.session: dict[str, Any] | None = None
        self.text: list[str] | None = None  # the open message's lines
        self.fact: dict[str, Any] | None = None

    def bad(self, n: int, why: str) -> ImportFileError:
        return ImportFileError(f"{self.source} line {n}: {why}. Nothing was written.")

    def conv(self, n: int) -> dict[str, Any]:
        if not self.convs:
            raise self.bad(n, "text before the first '## Space:' heading")
        return self.convs[-1]

    def close_message(self) -> None:
        if self.text is not None:
            msg = self.conv(0)["messages"][-1]
            msg["text"] = "\n".join(self.text).rstrip("\n")
            msg["tokens"] = _COUNT.count(msg["text"])
            self.text = None

    def line(self, n: int, line: str) -> None:
        handlers: list[tuple[re.Pattern[str] | str, Callable[[int, Any], None]]] = [
            ("## Space: ", self.space),
            (_MESSAGE, self.message),
            ("### Current session", self.current),
            (_SESSION, self.open_session),
            (_BEFORE, self.before),
            (_FACT, self.add_fact),
            (_ROLLING, self.rolling),
            ("Long-term summary: ", self.longterm),
        ]
        for pattern, handle in handlers:
            if isinstance(pattern, str):
                if line.startswith(pattern):
                    self.close_message()
                    handle(n, line[len(pattern) :])
                    return
            elif (match := pattern.fullmatch(line)) is not None:
                self.close_message()
                handle(n, match)
                return
        if self.text is not None:
            self.text.append(line)
        elif _OLD_MESSAGE.match(line):
            raise self.bad(n, "this transcript was written by an older meshsage and names no "
                           "role or id for its messages. Fix: export again (any format) with "
                           "this meshsage, or import its JSON export")  # fmt: skip
        elif self.session is not None and line.startswith("_") and line.endswith("_"):
            self.session["summary"] = line[1:-1]
            self.session["tokens"] = _COUNT.count(self.session["summary"])

    def space(self, n: int, space: str) -> None:
        self.session = self.fact = None
        self.convs.append({"id": len(self.convs) + 1, "space": space, "created_at": 0.0,
                           "reset_after": 0, "incognito": False, "messages": [],
                           "summaries": [], "sessions": [], "facts": [],
                           "longterm_summary": None})  # fmt: skip

    def message(self, n: int, m: re.Match[str]) -> None:
        conv = self.conv(n)
        when = _time(m[2], lambda: self.bad(n, f"{m[2]!r} is not a date"))
        conv["messages"].append({
            "id": int(m[4]), "role": m[3], "author": m[1], "text": "", "created_at": when,
            "tokens": 0, "platform_id": None, "reply_to_platform_id": None, "parent_id": None,
            "status": "answered" if m[3] == "user" else "delivered", "uses": 0,
            "important": False,
        })  # fmt: skip
        if len(conv["messages"]) == 1:
            conv["created_at"] = when
        if self.session is not None:
            s = self.session
            if not s["messages"]:
                s.update(first_message_id=int(m[4]), started_at=when)
            s.update(last_message_id=int(m[4]), ended_at=when, messages=s["messages"] + 1)
        self.text = [m[5]]

    def current(self, n: int, _rest: str) -> None:
        self.session = None

    def open_session(self, n: int, m: re.Match[str]) -> None:
        title = None if m[1] == "Session" else m[1]
        self.session = {"id": 0, "first_message_id": 0, "last_message_id": 0, "started_at": 0.0,
                        "ended_at": 0.0, "messages": 0, "title": title, "summary": None,
                        "tokens": 0}  # fmt: skip
        self.conv(n)["sessions"].append(self.session)

    def add_fact(self, n: int, m: re.Match[str]) -> None:
        pinned = m[2] == "pinned"
        self.fact = {"id": 0, "text": m[1], "tokens": _COUNT.count(m[1]),
                     "created_at": _time(m[3], lambda: self.bad(n, f"{m[3]!r} is not a date")),
                     "updated_at": None, "pinned": pinned,
                     "source_ids": [] if pinned else _ids(m[2]), "history": []}  # fmt: skip
        self.conv(n)["facts"].append(self.fact)

    def before(self, n: int, m: re.Match[str]) -> None:
        if self.fact is None:
            raise self.bad(n, "an earlier value with no fact above it")
        yours = m[2] == "yours"
        until = _time(m[3], lambda: self.bad(n, f"{m[3]!r} is not a date"))
        self.fact["history"].insert(0, {"text": m[1], "until": until, "pinned": yours,
                                        "source_ids": [] if yours else _ids(m[2])})  # fmt: skip

    def rolling(self, n: int, m: re.Match[str]) -> None:
        self.conv(n)["summaries"].append({
            "id": 0, "text": m[3], "first_message_id": int(m[1]),
            "last_message_id": int(m[2]), "tokens": _COUNT.count(m[3]), "created_at": 0.0,
        })  # fmt: skip

    def longterm(self, n: int, text: str) -> None:
        self.conv(n)["longterm_summary"] = {"text": text, "tokens": _COUNT.count(text),
                                            "sessions": 0, "up_to_message_id": 0,
                                            "updated_at": 0.0}  # fmt: skip

    def finish(self) -> list[dict[str, Any]]:
        """Close the last message; give rows their ids and the dates the transcript implies."""
        self.close_message()
        next_id = dict.fromkeys(("summaries", "sessions", "facts"), 1)
        for conv in self.convs:
            dates = {m["id"]: m["created_at"] for m in conv["messages"]}
            conv["sessions"] = [s for s in conv["sessions"] if s["messages"]]
            for table in next_id:
                for row in conv[table]:
                    row["id"] = next_id[table]
                    next_id[table] += 1
            for s in conv["summaries"]:
                s["created_at"] = dates.get(s["last_message_id"], conv["created_at"])
            lt = conv["longterm_summary"]
            if lt is not None and conv["sessions"]:
                last = conv["sessions"][-1]
                lt.update(sessions=len(conv["sessions"]), up_to_message_id=last["last_message_id"],
                          updated_at=last["ended_at"])  # fmt: skip
        return self.convs


def _time(iso: str, bad: Callable[[], ImportFileError]) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        raise bad() from None


def _ids(kind: str) -> list[int]:
    return [int(i) for i in re.findall(r"\d+", kind)]
