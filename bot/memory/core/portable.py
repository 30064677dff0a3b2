"""Export and import at the row level: one person's memory on one transport as plain data
(both backends).

Invariants:
- ``dump_person`` is deterministic (rows in id order, no clock reads), so dumping what
  ``load_dump`` wrote gives back the same data.
- ``load_dump`` writes everything in one transaction, or nothing: a conversation the database
  already has, or an id already taken, raises ``ImportRefused`` before any row is written.
  Imported rows keep their ids (PostgreSQL then moves its id sequences past them) and messages
  get their search words as they are written, as every other write does.
- The input was already validated (bot.memory.export); this layer trusts shapes, not content.
"""

from __future__ import annotations

import json
from typing import Any

from bot.errors import MemoryRefused
from bot.memory.core.db import CoreBase, Dialect, Tx
from bot.memory.records import CONVERSATION_FIELDS, LONGTERM_FIELDS
from bot.memory.records import DUMP_TABLES as TABLES

_CHUNK = 500  # ids per "already taken?" query


class ImportRefused(MemoryRefused):
    """Import refused before writing anything (ids or conversations already taken)."""


class PortableMixin(CoreBase):
    async def dump_person(self, transport: str, person: str) -> list[dict[str, Any]]:
        """Every conversation of ``person`` on ``transport`` with all its rows."""
        convs = await self._all(
            "SELECT id, space, created_at, reset_after, incognito, merged_into "
            "FROM conversations WHERE transport = ? AND person = ? ORDER BY id",
            (transport, person),
        )
        out: list[dict[str, Any]] = []
        for row in convs:
            conv = dict(zip(CONVERSATION_FIELDS, tuple(row)[:5], strict=True))
            conv["incognito"] = bool(conv["incognito"])
            home, origin = (row[0], None) if row[5] is None else (row[5], row[0])
            for table, fields in TABLES.items():
                where = "conversation_id = ?"
                params: tuple[Any, ...] = (home,)
                if table == "summaries":
                    params = (row[0],)
                elif origin is not None:
                    where += " AND origin_conversation_id = ?"
                    params = (home, origin)
                else:  # a home's own rows: what a link joined in is the other side's export
                    where += " AND origin_conversation_id IS NULL"
                rows = await self._all(
                    f"SELECT {', '.join(fields)} FROM {table} WHERE {where} ORDER BY id", params
                )
                conv[table] = [_out(table, dict(zip(fields, r, strict=True))) for r in rows]
            lt = await self._one(
                f"SELECT {', '.join(LONGTERM_FIELDS)} FROM longterm_summaries "
                "WHERE conversation_id = ? ORDER BY up_to_message_id DESC, id DESC LIMIT 1",
                (row[0],),
            )
            conv["longterm_summary"] = (
                None if lt is None else dict(zip(LONGTERM_FIELDS, lt, strict=True))
            )
            partner = await self._one(  # the other side of a link (export.restore_links)
                "SELECT transport, person, merged_into IS NULL FROM conversations "
                "WHERE id = ? OR merged_into = ? ORDER BY id LIMIT 1",
                (row[5] if row[5] is not None else -1, row[0]),
            )
            if partner is not None:
                conv["link"] = {"transport": partner[0], "person": partner[1],
                                "home": not bool(partner[2])}  # fmt: skip
            out.append(conv)
        return out

    async def load_dump(
        self, transport: str, person: str, conversations: list[dict[str, Any]]
    ) -> dict[str, int]:
        """Insert validated conversations with their own ids; all or nothing."""
        counts = {"conversations": 0, **dict.fromkeys(TABLES, 0)}
        async with self._atomic() as tx:
            for conv in conversations:
                await _refuse_taken(tx, self.dialect, transport, person, conv)
            for conv in conversations:
                await tx.exec(
                    "INSERT INTO conversations (id, transport, person, space, created_at, "
                    "reset_after, incognito) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (conv["id"], transport, person, conv["space"], conv["created_at"],
                     conv["reset_after"], int(conv["incognito"])),
                )  # fmt: skip
                counts["conversations"] += 1
                for table, fields in TABLES.items():
                    rows = [
                        (conv["id"], *(_in(table, f, r[f]) for f in fields)) for r in conv[table]
                    ]
                    if rows:
                        sql, args = self._insert_rows(table, ("conversation_id", *fields), rows)
                        await tx.many(sql, args)
                    counts[table] += len(rows)
                await tx.exec(  # its facts came with it: extraction goes on after them
                    "UPDATE conversations SET facts_through = coalesce((SELECT max(id) "
                    "FROM messages WHERE conversation_id = ?), 0) WHERE id = ?",
                    (conv["id"], conv["id"]),
                )
                lt = conv["longterm_summary"]
                if lt is not None:
                    await tx.exec(
                        "INSERT INTO longterm_summaries (conversation_id, text, tokens, sessions,"
                        " up_to_message_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                        (conv["id"], *(lt[f] for f in LONGTERM_FIELDS)),
                    )
            await self._after_import(tx)
        return counts


def _out(table: str, row: dict[str, Any]) -> dict[str, Any]:
    if table == "facts":
        row["pinned"] = bool(row["pinned"])
        row["source_ids"] = json.loads(row["source_ids"])
        row["history"] = _history(row["history"])
    elif table == "messages":
        row["important"] = bool(row["important"])
    return row


def _history(raw: str | None) -> list[dict[str, Any]]:
    """A fact's history as stored (JSON, oldest first), each earlier value with when it
    stopped holding, whose it was and the messages it came from."""
    try:
        items = json.loads(raw or "[]")
    except ValueError:
        return []
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _in(table: str, field: str, value: Any) -> Any:
    if table == "facts" and field in ("source_ids", "history"):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return int(value)
    return value


async def _refuse_taken(
    tx: Tx, d: Dialect, transport: str, person: str, conv: dict[str, Any]
) -> None:
    taken = await tx.val(
        "SELECT 1 FROM conversations WHERE id = ? OR (transport = ? AND person = ? AND space = ?)",
        (conv["id"], transport, person, conv["space"]),
    )
    if taken is not None:
        raise ImportRefused(
            f"this database already has a conversation with id {conv['id']} or for "
            f"{transport}:{person} in {conv['space']!r}. Fix: import into an empty database "
            f"({d.fresh}), or delete that memory first (!forget)."
        )
    for table in TABLES:
        ids = [r["id"] for r in conv[table]]
        for start in range(0, len(ids), _CHUNK):
            where, params = d.in_ids("id", ids[start : start + _CHUNK])
            hit = await tx.val(f"SELECT id FROM {table} WHERE {where} LIMIT 1", params)
            if hit is not None:
                raise ImportRefused(
                    f"{table} id {hit} is already used in this database. Fix: import "
                    f"into an empty database ({d.fresh})."
                )
