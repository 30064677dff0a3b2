"""Deleting and upkeep on PostgreSQL: ``!forget``, retention, counts.

Invariants:
- ``forget_person`` deletes every row about a person in one transaction: conversations
  cascade to messages (and with them their search words, which live in the row, and their
  vectors), summaries, facts and ``heard`` claims; their ``message_words`` rows go with them
  (a trigger).
  The person's outbox rows (and their parts) go in the same transaction, and on one side of
  a link what the other side derived from this side's words (``bot.memory.keep``).
- Retention and forgetting by use also prune finished outbox rows past their short keep.
  ``VACUUM`` then removes the dead row versions and their index entries at once, so nothing
  can read them back. PostgreSQL does not zero the space it frees (SQLite's
  ``secure_delete`` does): the bytes stay in free space and in the WAL until overwritten,
  which docs/postgresql.md says, with ``VACUUM FULL`` for a physical purge.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from bot.memory.core.db import POSTGRES
from bot.memory.core.identity import give_back
from bot.memory.keep import facts_touching, outbox_cutoff
from bot.memory.postgres.base import Conn, PgBase, PgTx, advance_sequences
from bot.memory.postgres.messages import SEARCH_SQL
from bot.memory.postgres.words import fold, meta
from bot.memory.records import ForgetReport


class UpkeepMixin(PgBase):
    async def forget_person(self, transport: str, person: str) -> ForgetReport:
        """Delete every row about ``person`` on ``transport``: all spaces, index rows included."""
        async with self._tx() as con:
            ids = [
                int(r[0])
                for r in await con.fetch(
                    "SELECT id FROM conversations WHERE transport = $1 AND person = $2 FOR UPDATE",
                    transport,
                    person,
                )
            ]
            counts = [0, 0, 0]
            if ids:
                # Linked DMs first go back apart: what came from the other side stays theirs,
                # what came from this person's side comes home to be deleted.
                absorbed_ids = [
                    int(r[0])
                    for r in await con.fetch(
                        "SELECT id FROM conversations WHERE id = ANY($1) AND merged_into IS NOT "
                        "NULL UNION SELECT id FROM conversations WHERE merged_into = ANY($1)",
                        ids,
                    )
                ]
                partners = await _partners(con, ids, absorbed_ids)
                theirs = {  # this person's words, wherever a link put them
                    int(r[0])
                    for r in await con.fetch(
                        "SELECT id FROM messages WHERE coalesce(origin_conversation_id, "
                        "conversation_id) = ANY($1)",
                        ids,
                    )
                }
                for absorbed in absorbed_ids:
                    await give_back(PgTx(con), POSTGRES, absorbed)
                await _clear_partners(con, partners, theirs)
                self._vectors.drop([p for p, _, _ in partners])
                for i, table in enumerate(("messages", "summaries", "facts")):
                    counts[i] = int(
                        await con.fetchval(
                            f"SELECT count(*) FROM {table} WHERE conversation_id = ANY($1)", ids
                        )
                    )
                await con.execute("DELETE FROM conversations WHERE id = ANY($1)", ids)
            await con.execute(
                "DELETE FROM outbox WHERE transport = $1 AND person = $2", transport, person
            )
        self._vectors.drop(ids)
        await self._vacuum()  # always: a repeated !forget erases again
        return ForgetReport(len(ids), *counts)

    async def _vacuum(self) -> None:
        """Make deletions physical: VACUUM frees the dead row versions and their index entries.
        Only the tables' owner may vacuum them; the bot's role is, since it created them."""

        async def work(con: Conn) -> None:
            for table in (
                "messages", "message_words", "message_vectors", "summaries", "facts", "heard",
                "outbox", "outbox_parts", "sessions", "longterm_summaries",
            ):  # fmt: skip
                self.last_erase = await con.execute(f"VACUUM {table}")

        await self._run(work)

    # --- operations -------------------------------------------------------------------------
    async def tidy(self) -> None:
        """Upkeep for idle moments: PostgreSQL's autovacuum does it; nothing to do here."""

    # --- moving (bot.memory.move) -----------------------------------------------------------
    async def table_columns(self, table: str) -> list[str]:
        """Column names of ``table`` in order; empty if there is no such table."""
        rows = await self._all(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1 "
            "AND table_schema = current_schema() ORDER BY ordinal_position",
            (table,),
        )
        return [str(r[0]) for r in rows]

    async def update_rows(
        self, table: str, key: str, column: str, rows: list[tuple[Any, Any]]
    ) -> None:
        """Set ``column`` from (key, value) pairs (references written after every row)."""
        async with self._tx() as con:
            await con.executemany(
                f"UPDATE {table} SET {column} = $1 WHERE {key} = $2", [(v, k) for k, v in rows]
            )

    async def count_rows(self, table: str) -> int:
        return int(await self._val(f"SELECT count(*) FROM {table}") or 0)

    async def export_rows(
        self, table: str, key: str, columns: tuple[str, ...], *, after: int, limit: int
    ) -> list[tuple[Any, ...]]:
        rows = await self._all(
            f"SELECT {', '.join(columns)} FROM {table} WHERE {key} > $1 ORDER BY {key} LIMIT $2",
            (after, limit),
        )
        return [tuple(r) for r in rows]

    async def import_rows(
        self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
    ) -> None:
        """Insert rows with their ids; messages get their search words as they arrive."""
        cols, values = list(columns), [f"${i}" for i in range(1, len(columns) + 1)]
        args: list[tuple[Any, ...]] = rows
        if table == "outbox" and "gateway" not in columns:  # migrated rows: this gateway's
            cols.append("gateway")
            values.append(f"${len(columns) + 1}")
            args = [(*r, self.gateway) for r in rows]
        if table == "messages":
            text, author, created = (columns.index(c) for c in ("text", "author", "created_at"))
            n = len(columns)
            cols.append("search")
            conv = columns.index("conversation_id") + 1
            values.append(SEARCH_SQL.format(c=conv, a=n + 1, b=n + 2))
            args = [(*r, fold(r[text]), fold(meta(r[author], r[created]))) for r in rows]
        async with self._tx() as con:
            await con.executemany(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(values)})", args
            )

    async def finish_import(self) -> None:
        """Move each id sequence past the copied ids, so new rows do not collide with them."""
        async with self._tx() as con:
            await advance_sequences(con)

    async def ping(self) -> None:
        """One trivial query through the pool (the watchdog's proof the store is not wedged)."""
        await self._val("SELECT 1")

    async def messages_since(self, since: float) -> dict[str, int]:
        """Messages per role created at or after ``since`` (the status file's daily counts)."""
        rows = await self._all(
            "SELECT role, count(*) FROM messages WHERE created_at >= $1 GROUP BY role", (since,)
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
            await self._val(
                "UPDATE messages SET uses = uses + 1 WHERE id = ANY($1::bigint[])",
                (list(message_ids),),
            )

    async def mark_important(self, conversation_id: int, message_ids: Sequence[int]) -> int:
        """``!pin``: these messages are never pruned by use."""
        if not message_ids:
            return 0
        value = await self._val(
            "WITH marked AS (UPDATE messages SET important = 1 WHERE conversation_id = $1 "
            "AND id = ANY($2::bigint[]) RETURNING 1) SELECT count(*) FROM marked",
            (conversation_id, list(message_ids)),
        )
        return int(value or 0)

    async def prune_by_use(self, max_per_conversation: int, *, batch: int = 500) -> int:
        """Keep at most ``max_per_conversation`` messages in each conversation: delete the
        least retrieved, oldest first; never important ones, nor the sources of pinned facts,
        nor messages still waiting for an answer. Finished outbox rows past their short keep
        go too (bot.memory.keep)."""
        await self.prune_outbox(outbox_cutoff(time.time()), batch=batch)
        total = 0
        rows = await self._all(
            "SELECT conversation_id, count(*) - $1 FROM messages GROUP BY conversation_id "
            "HAVING count(*) > $1",
            (max_per_conversation,),
        )
        for conversation_id, excess in rows:
            while excess > 0:
                n = int(
                    await self._val(
                        "WITH gone AS (DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                        "WHERE conversation_id = $1 AND important = 0 "
                        "AND status NOT IN ('pending', 'sending') AND id NOT IN "
                        "(SELECT j::bigint FROM facts f, jsonb_array_elements_text("
                        "f.source_ids::jsonb) j WHERE f.conversation_id = $1 AND f.pinned = 1) "
                        "ORDER BY uses, id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1) "
                        "SELECT count(*) FROM gone",
                        (conversation_id, min(excess, batch)),
                    )
                    or 0
                )
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
        in small batches; pending rows stay (bot.memory.keep)."""
        total = 0
        while True:
            n = int(
                await self._val(
                    "WITH gone AS (DELETE FROM outbox WHERE id IN (SELECT id FROM outbox "
                    "WHERE state != 'pending' AND updated_at < $1 ORDER BY updated_at LIMIT $2 "
                    "FOR UPDATE SKIP LOCKED) RETURNING 1) SELECT count(*) FROM gone",
                    (before, batch),
                )
                or 0
            )
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int:
        """Retention: delete messages created before ``cutoff`` in small batches (no long lock),
        and finished outbox rows (the answers' text) past their short keep."""
        await self.prune_outbox(outbox_cutoff(time.time()), batch=batch)
        total = 0
        while True:
            n = int(
                await self._val(
                    "WITH gone AS (DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                    "WHERE created_at < $1 ORDER BY created_at LIMIT $2 "
                    "FOR UPDATE SKIP LOCKED) RETURNING conversation_id) "
                    "SELECT count(*) FROM gone",
                    (cutoff, batch),
                )
                or 0
            )
            if n:
                self._vectors.clear()
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)


async def _partners(con: Conn, ids: list[int], absorbed: list[int]) -> list[tuple[int, str, str]]:
    """The other sides (id, transport, person) of the links ``ids`` take part in."""
    linked = set(absorbed)
    for r in await con.fetch(
        "SELECT merged_into FROM conversations WHERE id = ANY($1) AND merged_into IS NOT NULL",
        ids,
    ):
        linked.add(int(r[0]))
    rows = await con.fetch(
        "SELECT id, transport, person FROM conversations WHERE id = ANY($1) ORDER BY id",
        sorted(linked - set(ids)),
    )
    return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


async def _clear_partners(
    con: Conn, partners: list[tuple[int, str, str]], theirs: set[int]
) -> None:
    """What the other side of a link derived from the forgotten side's words (bot.memory.keep)."""
    for other, transport, person in partners:
        await con.execute("DELETE FROM summaries WHERE conversation_id = $1", other)
        await con.execute("DELETE FROM longterm_summaries WHERE conversation_id = $1", other)
        await con.execute(
            "UPDATE sessions SET title = NULL, summary = NULL, tokens = 0 "
            "WHERE conversation_id = $1",
            other,
        )
        rows = await con.fetch("SELECT id, source_ids FROM facts WHERE conversation_id = $1", other)
        gone = facts_touching([(r[0], r[1]) for r in rows], theirs)
        if gone:
            await con.execute("DELETE FROM facts WHERE id = ANY($1::bigint[])", gone)
        await con.execute(
            "DELETE FROM outbox WHERE transport = $1 AND person = $2", transport, person
        )
