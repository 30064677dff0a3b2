"""Export and import of one person's memory on one transport.

Formats: ``json`` (everything: messages with ids, dates, platform ids, reply links, use counts;
summaries; sessions; facts with provenance and their history (each earlier value, until when
it held, whose it was and the messages it came from); the newest long-term summary; the
document ``import`` reads), ``jsonl`` (the OpenAI chat fine-tuning format: one line per
answered session, each with its rows under ``meshsage``, so it reads back whole), ``md`` (a
transcript by session, each message with its role and id, each fact with its earlier values)
and ``mermaid`` (the reply-thread graph, write-only). Reading them: ``export_read``.

Invariants:
- An export contains only rows of the requesting person, and ``!export`` sends it to that
  person privately (``Attachment.dm_only``). A person with a pinned mesh key (``key_pins``)
  gets it in ``key_pin`` (their public key, its fingerprint, since when); import pins it
  again only where no key is pinned (a file never replaces a pin: ``meshsage pins`` does).
- Every format is deterministic for the same rows: export -> import into an empty database ->
  export gives the same bytes.
- Import reads at most ``MAX_IMPORT_BYTES``, validates the whole document (format, version,
  types, duplicate and dangling ids) before the store sees it, and the store writes it in one
  transaction: a bad file gets one clear error and writes nothing.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from bot.domain import ConversationKey
from bot.errors import MemoryRefused, MeshsageError
from bot.memory.port_identity import Identities
from bot.memory.port_log import ConversationLog
from bot.memory.port_upkeep import Upkeep
from bot.memory.records import (
    CONVERSATION_FIELDS,
    FACT_FIELDS,
    LONGTERM_FIELDS,
    MESSAGE_FIELDS,
    SESSION_FIELDS,
    SUMMARY_FIELDS,
)
from bot.transports.mesh_keys import PUBLIC_KEY_BYTES, fingerprint


class PortableStore(ConversationLog, Identities, Upkeep, Protocol):
    """What a person's export and import read and write."""


log = logging.getLogger("bot.memory.export")

FORMAT = "meshsage-export"
VERSION = 1
FORMATS = ("json", "jsonl", "md", "mermaid")
MAX_IMPORT_BYTES = 32 * 1024 * 1024
MERMAID_LABEL_CHARS = 40


class ImportFileError(MeshsageError):
    """A file that cannot be imported; the message says what is wrong and how to fix it."""

    exit_code = 1


def _key_ok(pin: Any) -> bool:
    if not isinstance(pin, dict) or not isinstance(pin.get("public_key"), str):
        return False
    try:
        return len(base64.b64decode(pin["public_key"], validate=True)) == PUBLIC_KEY_BYTES
    except ValueError:
        return False


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


async def person_document(store: PortableStore, transport: str, person: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "transport": transport,
        "person": person,
        "conversations": await store.dump_person(transport, person),
    }
    pin = await store.key_pin(transport, person)
    if pin is not None:  # only when there is one: exports without a pin keep their bytes
        doc["key_pin"] = {
            "public_key": base64.b64encode(pin.public_key).decode("ascii"),
            "fingerprint": fingerprint(pin.public_key),
            "pinned_at": pin.pinned_at,
        }
    return doc


def render(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    if fmt == "jsonl":
        return _jsonl(doc)
    if fmt == "md":
        return _markdown(doc)
    if fmt == "mermaid":
        return _mermaid(doc)
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


async def export_person(store: PortableStore, transport: str, person: str) -> tuple[str, str]:
    """(markdown, json) documents, as ``!export`` sends them."""
    doc = await person_document(store, transport, person)
    return render(doc, "md"), render(doc, "json")


def _session_of(conv: dict[str, Any]) -> Callable[[int], dict[str, Any] | None]:
    sessions = conv["sessions"]

    def find(message_id: int) -> dict[str, Any] | None:
        for s in sessions:
            if s["first_message_id"] <= message_id <= s["last_message_id"]:
                return dict(s)
        return None

    return find


def _by_session(conv: dict[str, Any]) -> list[tuple[dict[str, Any] | None, list[dict[str, Any]]]]:
    find = _session_of(conv)
    groups: list[tuple[dict[str, Any] | None, list[dict[str, Any]]]] = []
    for m in conv["messages"]:
        session = find(m["id"])
        if groups and (groups[-1][0] or {}).get("id") == (session or {}).get("id"):
            groups[-1][1].append(m)
        else:
            groups.append((session, [m]))
    return groups


def _markdown(doc: dict[str, Any]) -> str:
    md = [f"# meshsage export for {doc['person']} ({doc['transport']})", ""]
    for conv in doc["conversations"]:
        md += [f"## Space: {conv['space']}", ""]
        if conv["facts"]:
            md.append("Facts:")
            for f in conv["facts"]:
                kind = "pinned" if f["pinned"] else f"from messages {f['source_ids']}"
                md.append(f"- {f['text']} ({kind}, {_iso(f['updated_at'] or f['created_at'])})")
                for h in reversed(f["history"]):  # the value it replaced first
                    was = "yours" if h["pinned"] else f"inferred from messages {h['source_ids']}"
                    md.append(f"  - before: {h['text']} ({was}, until {_iso(h['until'])})")
            md.append("")
        if conv["longterm_summary"]:
            md += [f"Long-term summary: {conv['longterm_summary']['text']}", ""]
        for s in conv["summaries"]:
            md += [f"Rolling summary (messages {s['first_message_id']}-"
                   f"{s['last_message_id']}): {s['text']}", ""]  # fmt: skip
        for session, messages in _by_session(conv):
            if session is not None:
                md += [f"### {_iso(session['started_at'])[:10]}: {session['title'] or 'Session'}"]
                if session["summary"]:
                    md.append(f"_{session['summary']}_")
                md.append("")
            else:
                md += ["### Current session", ""]
            for m in messages:  # the role and id let ``export_read`` read the line back
                when = f"{_iso(m['created_at'])}, {m['role']} #{m['id']}"
                md += [f"**{m['author']}** ({when}): {m['text']}", ""]
    return "\n".join(md)


def _chat(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A session as one fine-tuning example: from the person's first line, [] without an answer."""
    chat = [{"role": m["role"], "content": m["text"]} for m in messages]
    while chat and chat[0]["role"] != "user":
        chat.pop(0)  # a fine-tuning example starts with the person speaking
    return chat if any(c["role"] == "assistant" for c in chat) else []


def _jsonl(doc: dict[str, Any]) -> str:
    """One fine-tuning example per answered session (``messages``, as before), each line also
    carrying its rows under ``meshsage`` so that ``import`` reads the file back whole: what no
    example holds (unanswered sessions, facts, summaries) rides on the conversation's first
    line, or on the file's last; only a file with no answer at all has a line without
    ``messages``."""
    lines: list[tuple[list[dict[str, str]], list[dict[str, Any]]]] = []
    rest: list[dict[str, Any]] = []  # parts of conversations with no example line
    for conv in doc["conversations"]:
        head = {k: v for k, v in conv.items() if k not in _ROWS}
        extra: dict[str, Any] = {
            **head, "messages": [], "sessions": [], "summaries": conv["summaries"],
            "facts": conv["facts"], "longterm_summary": conv["longterm_summary"],
        }  # fmt: skip
        first: dict[str, Any] | None = None
        for session, messages in _by_session(conv):
            chat = _chat(messages)
            sessions = [] if session is None else [session]
            if not chat:
                extra["messages"] += messages
                extra["sessions"] += sessions
                continue
            part = {**head, "messages": messages, "sessions": sessions}
            first = first or part
            lines.append((chat, [part]))
        if first is None:
            rest.append(extra)
        else:  # the first example's own rows come first, as in the conversation
            for key in ("messages", "sessions"):
                first[key] = sorted(first[key] + extra[key], key=lambda r: int(r["id"]))
            first.update(summaries=extra["summaries"], facts=extra["facts"],
                         longterm_summary=extra["longterm_summary"])  # fmt: skip
    if lines:
        lines[-1][1].extend(rest)
    elif rest:
        lines.append(([], rest))
    out = []
    for chat, parts in lines:
        line: dict[str, Any] = {"messages": chat} if chat else {}
        line["meshsage"] = {
            "format": FORMAT, "version": VERSION, "transport": doc["transport"],
            "person": doc["person"], "conversations": parts,
        }  # fmt: skip
        out.append(json.dumps(line, ensure_ascii=False, sort_keys=True))
    return "".join(line + "\n" for line in out)


_ROWS = ("messages", "summaries", "sessions", "facts", "longterm_summary")


def _mermaid(doc: dict[str, Any]) -> str:
    out = ["graph TD"]
    for conv in doc["conversations"]:
        out.append(f'  subgraph space_{conv["id"]}["{_label(conv["space"])}"]')
        for m in conv["messages"]:
            out.append(f'    m{m["id"]}["{m["role"]}: {_label(m["text"])}"]')
        out.append("  end")
        for m in conv["messages"]:
            if m["parent_id"] is not None:
                out.append(f"  m{m['parent_id']} --> m{m['id']}")
    return "\n".join(out) + "\n"


def _label(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MERMAID_LABEL_CHARS:
        text = text[: MERMAID_LABEL_CHARS - 1] + "…"
    return text.replace('"', "#quot;").replace("[", "(").replace("]", ")")


# --- import -------------------------------------------------------------------------------------
def read_bytes(path: Path) -> bytes:
    """An export file's bytes, at most ``MAX_IMPORT_BYTES``; ``ImportFileError`` otherwise."""
    try:
        size = path.stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise ImportFileError(
                f"{path} is {size // (1024 * 1024)} MB, more than the "
                f"{MAX_IMPORT_BYTES // 2**20} MB an export of one person can be. Fix: check "
                "that it is a meshsage export."
            )
        with path.open("rb") as fh:
            return fh.read(MAX_IMPORT_BYTES + 1)
    except OSError as exc:
        raise ImportFileError(f"cannot read {path}: {exc.strerror}. Fix: check the path.") from None


def read_import(path: Path) -> dict[str, Any]:
    """Read and validate a JSON export; raise ``ImportFileError`` saying what is wrong (every
    format: ``bot.memory.export_read.read_export``)."""
    try:
        doc = json.loads(read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ImportFileError(
            f"{path} is not a JSON export ({type(exc).__name__}: {exc}). Fix: import the file "
            "`meshsage export PERSON --format json` wrote."
        ) from None
    return validate(doc, source=str(path))


def validate(doc: Any, *, source: str = "the file") -> dict[str, Any]:
    def bad(why: str) -> ImportFileError:
        return ImportFileError(f"{source} cannot be imported: {why}. Nothing was written.")

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise bad(f'it is not a {FORMAT} document (no "format": "{FORMAT}")')
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise bad("its version is missing")
    if version > VERSION:
        raise bad(f"it was written by a newer meshsage (format version {version}, this one "
                  f"reads {VERSION}). Fix: upgrade meshsage, then import again")  # fmt: skip
    if version < 1:
        raise bad(f"format version {version} does not exist")
    for key in ("transport", "person"):
        if not isinstance(doc.get(key), str) or not doc[key] or len(doc[key]) > 200:
            raise bad(f'"{key}" must be a non-empty string')
    convs = doc.get("conversations")
    if not isinstance(convs, list):
        raise bad('"conversations" must be a list')
    pin = doc.get("key_pin")
    if pin is not None and not _key_ok(pin):
        raise bad('"key_pin" must hold the "public_key" of 32 bytes in base64')
    seen: dict[str, set[int]] = {
        t: set() for t in ("conversations", "messages", "summaries", "sessions", "facts")
    }
    spaces: set[str] = set()
    for ci, conv in enumerate(convs):
        where = f"conversations[{ci}]"
        _fields(conv, CONVERSATION_FIELDS, where, bad)
        _typed(conv, where, bad, ints=("id", "reset_after"), floats=("created_at",),
               strs=("space",), bools=("incognito",))  # fmt: skip
        _unique(seen["conversations"], conv["id"], where, bad)
        if conv["space"] in spaces:
            raise bad(f"{where}: space {conv['space']!r} appears twice")
        spaces.add(conv["space"])
        msg_ids: set[int] = set()
        for table, fields, spec in (
            ("messages", MESSAGE_FIELDS, _MESSAGE_TYPES),
            ("summaries", SUMMARY_FIELDS, _SUMMARY_TYPES),
            ("sessions", SESSION_FIELDS, _SESSION_TYPES),
            ("facts", FACT_FIELDS, _FACT_TYPES),
        ):
            rows = conv.get(table)
            if not isinstance(rows, list):
                raise bad(f'{where}: "{table}" must be a list')
            for ri, row in enumerate(rows):
                rwhere = f"{where}.{table}[{ri}]"
                if table == "facts" and isinstance(row, dict):
                    row.setdefault("history", [])  # written before facts had a history
                _fields(row, fields, rwhere, bad)
                _typed(row, rwhere, bad, **spec)
                _unique(seen[table], row["id"], rwhere, bad)
                if table == "messages":
                    msg_ids.add(row["id"])
                    if row["role"] not in ("user", "assistant"):
                        raise bad(f"{rwhere}: role must be user or assistant")
                    if row["parent_id"] is not None and row["parent_id"] not in msg_ids:
                        raise bad(f"{rwhere}: replies to message {row['parent_id']}, which is "
                                  "not earlier in the file")  # fmt: skip
                if table == "facts" and not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in row["source_ids"]
                ):
                    raise bad(f"{rwhere}: source_ids must be message ids")
                if table == "facts":
                    _check_history(row["history"], rwhere, bad)
                if "first_message_id" in row and row["first_message_id"] > row["last_message_id"]:
                    raise bad(f"{rwhere}: first_message_id is after last_message_id")
        link = conv.get("link")
        if link is not None and not (
            isinstance(link, dict)
            and all(isinstance(link.get(k), str) and link[k] for k in ("transport", "person"))
            and isinstance(link.get("home"), bool)
        ):
            raise bad(f'{where}.link must be {{"transport": ..., "person": ..., "home": '
                      "true|false} or absent")  # fmt: skip
        lt = conv.get("longterm_summary", "missing")
        if lt == "missing":
            raise bad(f'{where}: "longterm_summary" is missing')
        if lt is not None:
            _fields(lt, LONGTERM_FIELDS, f"{where}.longterm_summary", bad)
            _typed(lt, f"{where}.longterm_summary", bad, strs=("text",),
                   ints=("tokens", "sessions", "up_to_message_id"),
                   floats=("updated_at",))  # fmt: skip
    return doc


_MESSAGE_TYPES: dict[str, tuple[str, ...]] = {
    "ints": ("id", "tokens", "uses"),
    "floats": ("created_at",),
    "strs": ("role", "author", "text", "status"),
    "opt_strs": ("platform_id", "reply_to_platform_id"),
    "opt_ints": ("parent_id",),
    "bools": ("important",),
}
_SUMMARY_TYPES: dict[str, tuple[str, ...]] = {
    "ints": ("id", "first_message_id", "last_message_id", "tokens"),
    "floats": ("created_at",),
    "strs": ("text",),
}
_SESSION_TYPES: dict[str, tuple[str, ...]] = {
    "ints": ("id", "first_message_id", "last_message_id", "messages", "tokens"),
    "floats": ("started_at", "ended_at"),
    "opt_strs": ("title", "summary"),
}
_FACT_TYPES: dict[str, tuple[str, ...]] = {
    "ints": ("id", "tokens"),
    "floats": ("created_at",),
    "opt_floats": ("updated_at",),
    "strs": ("text",),
    "bools": ("pinned",),
    "lists": ("source_ids", "history"),
}


def _check_history(items: list[Any], where: str, bad: Callable[[str], ImportFileError]) -> None:
    """A fact's history: earlier values, each ``{"text", "until", "pinned", "source_ids"}``."""
    for i, item in enumerate(items):
        hwhere = f"{where}.history[{i}]"
        _fields(item, ("text", "until", "pinned", "source_ids"), hwhere, bad)
        _typed(item, hwhere, bad, strs=("text",), floats=("until",), bools=("pinned",),
               lists=("source_ids",))  # fmt: skip
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in item["source_ids"]):
            raise bad(f"{hwhere}: source_ids must be message ids")


def _fields(
    row: Any, fields: tuple[str, ...], where: str, bad: Callable[[str], ImportFileError]
) -> None:
    if not isinstance(row, dict):
        raise bad(f"{where} must be an object")
    missing = [f for f in fields if f not in row]
    if missing:
        raise bad(f"{where} lacks {', '.join(missing)}")


def _typed(
    row: dict[str, Any],
    where: str,
    bad: Callable[[str], ImportFileError],
    *,
    ints: tuple[str, ...] = (),
    floats: tuple[str, ...] = (),
    strs: tuple[str, ...] = (),
    bools: tuple[str, ...] = (),
    opt_strs: tuple[str, ...] = (),
    opt_ints: tuple[str, ...] = (),
    opt_floats: tuple[str, ...] = (),
    lists: tuple[str, ...] = (),
) -> None:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62

    def is_num(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e13

    checks: list[tuple[tuple[str, ...], Callable[[Any], bool], str]] = [
        (ints, is_int, "a non-negative integer"),
        (floats, is_num, "a number (seconds since 1970)"),
        (strs, lambda v: isinstance(v, str), "a string"),
        (bools, lambda v: isinstance(v, bool), "true or false"),
        (opt_strs, lambda v: v is None or isinstance(v, str), "a string or null"),
        (opt_ints, lambda v: v is None or is_int(v), "an integer or null"),
        (opt_floats, lambda v: v is None or is_num(v), "a number or null"),
        (lists, lambda v: isinstance(v, list), "a list"),
    ]
    for names, ok, what in checks:
        for name in names:
            if not ok(row.get(name)):
                raise bad(f"{where}.{name} must be {what}")


def _unique(seen: set[int], value: int, where: str, bad: Callable[[str], ImportFileError]) -> None:
    if value in seen:
        raise bad(f"{where}: id {value} appears twice")
    seen.add(value)


async def import_document(store: PortableStore, doc: dict[str, Any]) -> dict[str, int]:
    """Write a validated document (one transaction; raises when ids are taken), then restore
    its links whose other side is already there (``links`` in the counts when any)."""
    counts = await store.load_dump(doc["transport"], doc["person"], doc["conversations"])
    links = await restore_links(store, doc)
    if links:
        counts["links"] = links
    pin = doc.get("key_pin")
    if pin is not None:  # validated: 32 bytes; an existing pin wins
        key = base64.b64decode(pin["public_key"])
        at = pin.get("pinned_at")
        when = float(at) if isinstance(at, int | float) else None
        held = await store.pin_key(doc["transport"], doc["person"], key, pinned_at=when)
        counts["key pin"] = int(held == key)
    return counts


async def restore_links(store: PortableStore, doc: dict[str, Any]) -> int:
    """Link again each imported DM whose export says it was linked, once both sides are in the
    database (import the two sides' exports in any order): the absorbed side's rows move into
    the home with their origin, as ``!link`` did."""
    done = 0
    for conv in doc["conversations"]:
        link = conv.get("link")
        if link is None:
            continue
        mine = ConversationKey(doc["transport"], doc["person"], conv["space"])
        other = ConversationKey(link["transport"], link["person"], conv["space"])
        if await store.find_conversation(other) is None:
            continue  # linked when the other side's export is imported
        home, absorbed = (mine, other) if link["home"] else (other, mine)
        try:
            await store.link_dm(home, absorbed)
        except MemoryRefused as exc:
            log.warning("import: the link of %s with %s was not restored: %s", mine, other, exc)
            continue
        done += 1
    return done
