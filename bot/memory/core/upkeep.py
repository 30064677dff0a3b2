"""Deleting and counting, both backends: ``!forget``, retention, forgetting by use, the row
copies of ``migrate-store``, counts.

Invariants:
- ``forget_person`` deletes every row about a person in one transaction: linked DMs first go
  back apart (what came from the other side stays theirs); then messages (explicitly, so
  SQLite's FTS delete trigger and PostgreSQL's word-table trigger see each row; vectors
  cascade), conversations (summaries, facts, sessions, ``heard`` cascade), and the person's
  outbox rows; on the other side of a link, what it derived from this person's words
  (``bot.memory.keep``), its recall notes included (they quote what retrieval found). The
  backend then makes the deletions physical (``_erase``); on SQLite a scrub mark commits
  with the delete (``_mark_erase``) so a crash cannot skip it.
  A repeated ``!forget`` always erases, even when nothing is left to delete.
- Retention and forgetting by use delete in small batches (no long lock); each batch drops, in
  its transaction, the recall notes that quoted a deleted message (``bot.memory.core.notes``).
  They also prune finished outbox rows past their short keep. On PostgreSQL a batch skips rows
  another gateway is deleting (``Dialect.skip_locked``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from bot.memory.core.db import CoreBase, Dialect, Tx
from bot.memory.core.identity import give_back
from bot.memory.core.notes import drop_stale_notes, quoted_json, quotes_missing
from bot.memory.core.versions import COPY_MARK
from bot.memory.keep import (
    COMMAND_TOMBSTONE_SECONDS,
    OUTBOX_KEEP_SECONDS,
    facts_touching,
    outbox_cutoff,
)
from bot.memory.records import ForgetReport


class UpkeepMixin(CoreBase):
    async def forget_person(self, transport: str, person: str) -> ForgetReport:
        """Delete every row about ``person`` on ``transport``: all spaces, index rows included."""
        d = self.dialect
        async with self._atomic() as tx:
            rows = await tx.all(
                "SELECT id FROM conversations WHERE transport = ? AND person = ?" + d.for_update,
                (transport, person),
            )
            ids = [int(r[0]) for r in rows]
            counts = [0, 0, 0]
            if ids:
                in_ids, params = d.in_ids("id", ids)
                in_homes, homes = d.in_ids("merged_into", ids)
                # Linked DMs first go back apart: what came from the other side stays theirs,
                # what came from this person's side comes home to be deleted.
                rows = await tx.all(
                    f"SELECT id FROM conversations WHERE {in_ids} AND merged_into IS NOT NULL "
                    f"UNION SELECT id FROM conversations WHERE {in_homes}",
                    (*params, *homes),
                )
                absorbed_ids = [int(r[0]) for r in rows]
                partners = await _partners(tx, d, ids, absorbed_ids)
                in_conv, conv_params = d.in_ids("conversation_id", ids)
                rows = await tx.all(  # this person's words, wherever a link put them
                    "SELECT id FROM messages WHERE "
                    + d.in_ids("coalesce(origin_conversation_id, conversation_id)", ids)[0],
                    conv_params,
                )
                theirs = {int(r[0]) for r in rows}
                for absorbed in absorbed_ids:
                    await give_back(tx, d, absorbed)
                await _clear_partners(tx, d, partners, theirs)
                self._vectors.drop([p for p, _, _ in partners])
                for i, table in enumerate(("messages", "summaries", "facts")):
                    n = await tx.val(f"SELECT count(*) FROM {table} WHERE {in_conv}", conv_params)
                    counts[i] = int(n or 0)
                await tx.exec(f"DELETE FROM messages WHERE {in_conv}", conv_params)
                await tx.exec(f"DELETE FROM conversations WHERE {in_ids}", params)
            await tx.exec(
                "DELETE FROM outbox WHERE transport = ? AND person = ?", (transport, person)
            )
            await tx.exec(  # the next PKI DM pins anew (trust on first use)
                "DELETE FROM key_pins WHERE transport = ? AND person = ?", (transport, person)
            )
            await self._mark_erase(tx)
        self._vectors.drop(ids)
        await self._erase()  # always: a repeated !forget erases again
        return ForgetReport(len(ids), *counts)

    # --- moving (bot.memory.move) -----------------------------------------------------------
    async def copy_unfinished(self) -> bool:
        """Whether a migrate-store copy into this store began and was never verified."""
        return bool(
            await self._val("SELECT count(*) FROM schema_migrations WHERE name = ?", (COPY_MARK,))
        )

    async def mark_copy(self, *, unfinished: bool) -> None:
        """Set (before the first row is copied) or clear (once every count is verified) the
        mark that makes every other opening of this store refuse it (``core.versions``)."""
        if unfinished:
            await self._exec(
                "INSERT INTO schema_migrations (name) VALUES (?) ON CONFLICT DO NOTHING",
                (COPY_MARK,),
            )
        else:
            await self._exec("DELETE FROM schema_migrations WHERE name = ?", (COPY_MARK,))

    async def empty_tables(self, tables: Sequence[str]) -> None:
        """Delete every row of ``tables`` (children first) in one transaction: an unfinished
        copy, before it starts over."""
        async with self._atomic() as tx:
            for table in tables:
                await tx.exec(f"DELETE FROM {table}")

    async def update_rows(
        self, table: str, key: str, column: str, rows: list[tuple[Any, Any]]
    ) -> None:
        """Set ``column`` from (key, value) pairs (references written after every row)."""
        async with self._atomic() as tx:
            await tx.many(
                f"UPDATE {table} SET {column} = ? WHERE {key} = ?", [(v, k) for k, v in rows]
            )

    async def count_rows(self, table: str) -> int:
        return int(await self._val(f"SELECT count(*) FROM {table}") or 0)

    async def export_rows(
        self, table: str, key: str, columns: tuple[str, ...], *, after: int, limit: int
    ) -> list[tuple[Any, ...]]:
        rows = await self._all(
            f"SELECT {', '.join(columns)} FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT ?",
            (after, limit),
        )
        return [tuple(r) for r in rows]

    async def import_rows(
        self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
    ) -> None:
        """Insert rows with their ids; search words are indexed as the rows arrive."""
        await self._bulk_insert(table, columns, rows)

    # --- counts -----------------------------------------------------------------------------
    async def messages_since(self, since: float) -> dict[str, int]:
        """Messages per role created at or after ``since`` (the status file's daily counts)."""
        rows = await self._all(
            "SELECT role, count(*) FROM messages WHERE created_at >= ? GROUP BY role", (since,)
        )
        return {str(r[0]): int(r[1]) for r in rows}

    async def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for table in ("conversations", "messages", "summaries", "facts"):
            out[table] = int(await self._val(f"SELECT count(*) FROM {table}") or 0)
        return out

    # --- forgetting by use --------------------------------------------------------------------
    async def note_retrieved(self, message_ids: Sequence[int]) -> None:
        """Count a use of each message that retrieval put into a prompt."""
        if message_ids:
            where, params = self.dialect.in_ids("id", message_ids)
            await self._exec(
                f"UPDATE messages SET uses = uses + 1 WHERE {where}", params, durable=False
            )

    async def save_recall_note(
        self, message_id: int, note: str, quoted: Sequence[int] = ()
    ) -> None:
        """Keep the recall note sent with a person's message (replaces an earlier one) and the
        ids of the messages it quotes (``bot.memory.core.notes``)."""
        # Clearing a note that is not there matches no row, so it writes no page (most turns:
        # a person's new message has no note, and SQLite rewrites a page even for equal values).
        await self._exec(
            "UPDATE messages SET recall_note = ?, recall_ids = ? "
            "WHERE id = ? AND (recall_note IS NOT NULL OR CAST(? AS TEXT) IS NOT NULL)",
            (note or None, quoted_json(note, quoted), message_id, note or None),
            durable=False,  # a note lost with the server is only not shown again
        )

    async def recall_notes(self, message_ids: Sequence[int]) -> dict[int, str]:
        """The recall notes kept with these messages (those that have one)."""
        if not message_ids:
            return {}
        where, params = self.dialect.in_ids("messages.id", message_ids)
        rows = await self._all(  # never one quoting what is gone (bot.memory.core.notes)
            f"SELECT id, recall_note FROM messages WHERE {where} AND recall_note IS NOT NULL "
            f"AND NOT {quotes_missing(self.dialect)}",
            params,
        )
        return {int(r[0]): str(r[1]) for r in rows}

    async def mark_important(
        self, conversation_id: int, message_ids: Sequence[int], *, done: int | None = None
    ) -> int:
        """``!pin``: these messages are never pruned by use. ``done``: the held command, marked
        done in the same transaction."""
        if not message_ids:
            return 0
        where, params = self.dialect.in_ids("id", message_ids)
        sql = f"UPDATE messages SET important = 1 WHERE conversation_id = ? AND {where}"
        if done is None:
            return await self._exec(sql, (conversation_id, *params))
        async with self._atomic() as tx:
            n = await tx.exec(sql, (conversation_id, *params))
            await self._command_done(tx, done)
        return n

    async def prune_by_use(self, max_per_conversation: int, *, batch: int = 500) -> int:
        """Keep at most ``max_per_conversation`` messages in each conversation: delete the
        least retrieved, oldest first; never important ones, nor the sources of pinned facts,
        nor messages still waiting for an answer. Summaries and sessions stay. Finished outbox
        rows past their short keep go too (bot.memory.keep)."""
        d = self.dialect
        await self.prune_outbox(outbox_cutoff(time.time()), batch=batch)
        total = 0
        rows = await self._all(
            "SELECT conversation_id, count(*) - ? FROM messages GROUP BY conversation_id "
            "HAVING count(*) > ?",
            (max_per_conversation, max_per_conversation),
        )
        pinned = d.json_ids.format(col="f.source_ids", alias="j")
        for conversation_id, excess in rows:
            while excess > 0:
                async with self._atomic() as tx:
                    n = await tx.exec(
                        "DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                        "WHERE conversation_id = ? AND important = 0 "
                        "AND status NOT IN ('pending', 'sending') AND id NOT IN "
                        f"(SELECT CAST(j.value AS BIGINT) FROM facts f, {pinned} "
                        " WHERE f.conversation_id = ? AND f.pinned = 1) "
                        f"ORDER BY uses, id LIMIT ?{d.skip_locked})",
                        (conversation_id, conversation_id, min(excess, batch)),
                    )
                    if n:  # no note may quote what was just deleted
                        await drop_stale_notes(tx, d, [conversation_id])
                if n:
                    self._vectors.drop([conversation_id])
                total += n
                excess -= n
                if n == 0:
                    break  # what is left is all kept on purpose
                await asyncio.sleep(0)
        return total

    async def prune_outbox(self, before: float, *, batch: int = 500) -> int:
        """Delete finished outbox rows last touched before ``before`` (their parts cascade),
        in small batches; pending rows stay (bot.memory.keep). Released held commands older
        than ``COMMAND_TOMBSTONE_SECONDS`` go too (catch-up reads back no further)."""
        await self._exec(
            "DELETE FROM held_commands WHERE released_at < ?",
            (before + OUTBOX_KEEP_SECONDS - COMMAND_TOMBSTONE_SECONDS,),
            durable=False,
        )
        total = 0
        while True:
            n = await self._exec(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox "
                "WHERE state != 'pending' AND updated_at < ? ORDER BY updated_at LIMIT ?"
                f"{self.dialect.skip_locked})",
                (before, batch),
            )
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)

    async def scrub_outbox(self, conversation_id: int, text: str) -> int:
        """Delete the finished outbox rows of this conversation's keys (a linked DM's too)
        whose text or rest holds ``text`` (``!unremember``: a fact's text leaves the outbox
        with it). Pending rows stay: delivery needs them."""
        if not text:
            return 0
        rows = await self._all(
            "SELECT o.id, o.text, o.rest FROM outbox o JOIN conversations c ON "
            "o.transport = c.transport AND o.person = c.person AND o.space = c.space "
            "WHERE (c.id = ? OR c.merged_into = ?) AND o.state != 'pending'",
            (conversation_id, conversation_id),
        )
        ids = [r[0] for r in rows if text in r[1] or (r[2] is not None and text in r[2])]
        if not ids:
            return 0
        where, params = self.dialect.in_ids("id", ids)
        return await self._exec(f"DELETE FROM outbox WHERE {where}", params)

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int:
        """Retention: delete messages created before ``cutoff`` in small batches (no long lock),
        and finished outbox rows (the answers' text) past their short keep."""
        await self.prune_outbox(outbox_cutoff(time.time()), batch=batch)
        total = 0
        while True:
            async with self._atomic() as tx:
                rows = await tx.all(
                    "DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                    f"WHERE created_at < ? ORDER BY created_at LIMIT ?{self.dialect.skip_locked})"
                    " RETURNING conversation_id",
                    (cutoff, batch),
                )
                n = len(rows)
                # No note may quote what was just deleted (bot.memory.core.notes).
                await drop_stale_notes(tx, self.dialect, [int(r[0]) for r in rows])
            if n:
                self._vectors.clear()  # pruned messages took their vectors with them
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)


async def _partners(
    tx: Tx, d: Dialect, ids: list[int], absorbed: list[int]
) -> list[tuple[int, str, str]]:
    """The other sides (id, transport, person) of the links ``ids`` take part in."""
    linked = set(absorbed)
    where, params = d.in_ids("id", ids)
    rows = await tx.all(
        f"SELECT merged_into FROM conversations WHERE {where} AND merged_into IS NOT NULL",
        params,
    )
    linked |= {int(r[0]) for r in rows}
    others = sorted(linked - set(ids))
    if not others:
        return []
    where, params = d.in_ids("id", others)
    rows = await tx.all(
        f"SELECT id, transport, person FROM conversations WHERE {where} ORDER BY id", params
    )
    return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


async def _clear_partners(
    tx: Tx, d: Dialect, partners: list[tuple[int, str, str]], theirs: set[int]
) -> None:
    """What the other side of a link derived from the forgotten side's words (bot.memory.keep)."""
    for other, transport, person in partners:
        await tx.exec("DELETE FROM summaries WHERE conversation_id = ?", (other,))
        await tx.exec("DELETE FROM longterm_summaries WHERE conversation_id = ?", (other,))
        await tx.exec(
            "UPDATE sessions SET title = NULL, summary = NULL, tokens = 0 "
            "WHERE conversation_id = ?",
            (other,),
        )
        await tx.exec(  # recall notes quote what retrieval found: maybe this side's words
            "UPDATE messages SET recall_note = NULL WHERE conversation_id = ? "
            "AND recall_note IS NOT NULL",
            (other,),
        )
        rows = await tx.all("SELECT id, source_ids FROM facts WHERE conversation_id = ?", (other,))
        gone = facts_touching([(r[0], r[1]) for r in rows], theirs)
        if gone:
            where, params = d.in_ids("id", gone)
            await tx.exec(f"DELETE FROM facts WHERE {where}", params)
        await tx.exec("DELETE FROM outbox WHERE transport = ? AND person = ?", (transport, person))
