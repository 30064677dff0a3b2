"""SQLite memory store: one aiosqlite connection, WAL, foreign keys, ordered migrations.

Invariants:
- The raw log (``messages``) is the ground truth; summaries and facts are derived from it and
  record which messages they cover.
- Every write holds ``self._lock`` and multi-statement writes run in one explicit transaction,
  so coroutines sharing the connection never interleave inside each other's transactions.
- ``reset_after`` on a conversation hides everything up to that message id from context:
  window, summaries (``first_message_id > reset_after``) and retrieval (FTS rowid range).
  A summary computed before a reset is refused at save time, inside the same transaction.
- ``open`` refuses a damaged file (header or pages, via ``quick_check``), a read-only file or
  an unwritable state directory with a ``StorageError`` that says how to fix it.
- ``forget_person`` deletes every row about a person: conversations cascade to messages,
  summaries and facts, messages cascade to their vectors; the FTS delete trigger removes the
  index entries, the index is then rewritten so no segment keeps their words, the WAL is
  checkpointed, and ``secure_delete`` overwrites the freed pages: none of their text stays in
  the database files.
- Vector search reads one conversation's vectors of one model, through an in-process matrix
  cache (``bot.memory.vectors``) that is changed only while ``self._lock`` is held: extended by
  ``add_vectors``, dropped by ``forget_person`` and retention, and cleared whenever another
  connection has written to the database (``PRAGMA data_version``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from bot.domain import ConversationKey
from bot.errors import StorageError
from bot.memory.schema import FTS_STRIDE, MIGRATIONS, applied_migrations, migrate
from bot.memory.vectors import VectorCache, VectorMatrix, as_vectors, pack, unit
from bot.ops.files import private_dir, private_file, tighten_if_present

log = logging.getLogger("bot.memory")

WAL_FORCE_BYTES = 64 * 1024 * 1024
FTS_MERGE_PAGES = 64  # a bounded slice of merge work per idle tick

USER = "user"
ASSISTANT = "assistant"


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    key: ConversationKey
    reset_after: int


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    author: str
    text: str
    created_at: float
    tokens: int
    platform_id: str | None
    parent_id: int | None
    status: str


@dataclass(frozen=True, slots=True)
class Summary:
    id: int
    text: str
    first_message_id: int
    last_message_id: int
    tokens: int
    created_at: float


@dataclass(frozen=True, slots=True)
class Fact:
    id: int
    text: str
    tokens: int
    created_at: float


@dataclass(frozen=True, slots=True)
class ForgetReport:
    conversations: int
    messages: int
    summaries: int
    facts: int


_MSG_COLS = (
    "id, conversation_id, role, author, text, created_at, tokens, platform_id, parent_id, status"
)


def _msg(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage(*row)


class SqliteStore:
    """Open with ``await SqliteStore.open(path)``; close with ``await store.close()``."""

    def __init__(self, *, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path
        self._lock = asyncio.Lock()
        self._vectors = VectorCache()
        self._data_version: int | None = None

    # --- lifecycle -------------------------------------------------------------------------
    @classmethod
    async def open(cls, path: Path) -> SqliteStore:
        path = Path(path)
        try:
            private_dir(path.parent)
        except OSError as exc:
            raise StorageError(
                f"cannot create the state directory {path.parent} ({exc.strerror}). "
                "Fix: create it and make it writable by this user, or set MESHSAGE_STATE_DIR "
                "(or state_dir in the config) to a writable directory."
            ) from None
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise StorageError(
                f"the state directory {path.parent} is not writable. Fix: "
                f"chown/chmod it for this user, or set MESHSAGE_STATE_DIR to a writable directory."
            )
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise StorageError(
                f"the database {path} is read-only for this user. Fix: make the file and its "
                "directory writable for this user (chown/chmod); the bot stores every message."
            )
        db: aiosqlite.Connection | None = None
        try:
            # 0600 before SQLite opens it: the -wal and -shm files copy the database's mode.
            private_file(path)
            for suffix in ("-wal", "-shm"):
                tighten_if_present(path.with_name(path.name + suffix))
            db = await aiosqlite.connect(path, isolation_level=None)
            await db.execute("PRAGMA busy_timeout = 5000")
            mode = await (await db.execute("PRAGMA journal_mode = WAL")).fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                log.warning("journal_mode is %s, not WAL", mode)
            for pragma in (
                "PRAGMA foreign_keys = ON",
                "PRAGMA synchronous = NORMAL",
                "PRAGMA secure_delete = ON",
                "PRAGMA temp_store = MEMORY",
                # Checkpoints happen in tidy(), between turns, instead of inside a reply's
                # commit; tidy() forces one if the WAL still grows past WAL_FORCE_BYTES.
                "PRAGMA wal_autocheckpoint = 0",
            ):
                await db.execute(pragma)
            done = await applied_migrations(db)
            todo = [name for name, _ in MIGRATIONS if name not in done]
            if done and todo:  # an upgrade: keep the old database until the new one works
                await _backup_before_upgrade(db, path, todo[0])
            applied = await migrate(db)
            if applied:
                log.info("database %s migrated: %s", path, ", ".join(applied))
            # quick_check reports damage as a row, not an exception: a file with a good header
            # but broken pages would otherwise open and fail on the first message.
            check = await (await db.execute("PRAGMA quick_check(1)")).fetchone()
            if check is None or check[0] != "ok":
                problem = " ".join(str(check[0]).split()) if check else "no result"
                raise sqlite3.DatabaseError(f"database disk image is malformed: {problem}")
            await db.execute("BEGIN IMMEDIATE")  # prove we can write before taking messages
            await db.execute("ROLLBACK")
        except sqlite3.DatabaseError as exc:
            if db is not None:
                await db.close()
            raise StorageError(_explain_db_error(path, exc)) from None
        return cls(db=db, path=path)

    async def close(self) -> None:
        async with self._lock:
            self._vectors.clear()
            with contextlib.suppress(sqlite3.Error):  # advisory; closing must still happen
                await self._db.execute("PRAGMA optimize")
            await self._db.close()

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            else:
                await self._db.execute("COMMIT")

    async def _all(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        async with self._lock:
            return list(await self._db.execute_fetchall(sql, tuple(params)))

    async def _one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self._all(sql, params)
        return rows[0] if rows else None

    # --- conversations ----------------------------------------------------------------------
    async def conversation(self, key: ConversationKey) -> Conversation:
        """Get or create the conversation for ``key``."""
        row = await self._one(
            "SELECT id, reset_after FROM conversations "
            "WHERE transport = ? AND person = ? AND space = ?",
            (key.transport, key.person, key.space),
        )
        if row is None:
            async with self._tx() as db:
                await db.execute(
                    "INSERT OR IGNORE INTO conversations (transport, person, space, created_at) "
                    "VALUES (?, ?, ?, ?)",
                    (key.transport, key.person, key.space, time.time()),
                )
                cur = await db.execute(
                    "SELECT id, reset_after FROM conversations "
                    "WHERE transport = ? AND person = ? AND space = ?",
                    (key.transport, key.person, key.space),
                )
                row = await cur.fetchone()
        assert row is not None
        return Conversation(id=row[0], key=key, reset_after=row[1])

    async def find_conversation(self, key: ConversationKey) -> Conversation | None:
        row = await self._one(
            "SELECT id, reset_after FROM conversations "
            "WHERE transport = ? AND person = ? AND space = ?",
            (key.transport, key.person, key.space),
        )
        return None if row is None else Conversation(id=row[0], key=key, reset_after=row[1])

    async def conversations_of(self, transport: str, person: str) -> list[Conversation]:
        rows = await self._all(
            "SELECT id, space, reset_after FROM conversations "
            "WHERE transport = ? AND person = ? ORDER BY id",
            (transport, person),
        )
        return [Conversation(r[0], ConversationKey(transport, person, r[1]), r[2]) for r in rows]

    async def reset(self, conversation_id: int) -> int:
        """Start a fresh conversation: everything so far leaves the context. Returns the mark."""
        async with self._tx() as db:
            cur = await db.execute(
                "SELECT coalesce(max(id), 0) FROM messages WHERE conversation_id = ?",
                (conversation_id,),
            )
            row = await cur.fetchone()
            mark = int(row[0]) if row else 0
            await db.execute(
                "UPDATE conversations SET reset_after = max(reset_after, ?) WHERE id = ?",
                (mark, conversation_id),
            )
        return mark

    async def reset_mark(self, conversation_id: int) -> int:
        row = await self._one(
            "SELECT reset_after FROM conversations WHERE id = ?", (conversation_id,)
        )
        return int(row[0]) if row else 0

    async def forget_person(self, transport: str, person: str) -> ForgetReport:
        """Delete every row about ``person`` on ``transport``: all spaces, index rows included."""
        async with self._tx() as db:
            cur = await db.execute(
                "SELECT id FROM conversations WHERE transport = ? AND person = ?",
                (transport, person),
            )
            ids = [r[0] for r in await cur.fetchall()]
            counts = [0, 0, 0]
            if ids:
                marks = ",".join("?" * len(ids))
                for i, table in enumerate(("messages", "summaries", "facts")):
                    cur = await db.execute(
                        f"SELECT count(*) FROM {table} WHERE conversation_id IN ({marks})", ids
                    )
                    row = await cur.fetchone()
                    counts[i] = int(row[0]) if row else 0
                # Messages go first, explicitly, so the FTS delete trigger sees each row
                # (and the vectors cascade with them).
                await db.execute(f"DELETE FROM messages WHERE conversation_id IN ({marks})", ids)
                await db.execute(f"DELETE FROM conversations WHERE id IN ({marks})", ids)
                self._vectors.drop(ids)
        if ids:
            await self._erase_deleted()
        return ForgetReport(len(ids), *counts)

    async def _erase_deleted(self) -> None:
        """Make deletions physical, not just invisible. FTS5 records a delete as a marker and
        keeps the words in older index segments until they are merged, and WAL frames keep
        old page images until a checkpoint; ``secure_delete`` only zeroes freed pages. So
        rewrite the index (seconds on a million messages; ``!forget`` is rare) and checkpoint.
        """
        async with self._lock:
            await self._db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('optimize')")
            await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # --- messages ---------------------------------------------------------------------------
    async def add_message(
        self,
        conversation_id: int,
        *,
        role: str,
        author: str,
        text: str,
        tokens: int,
        status: str,
        created_at: float | None = None,
        platform_id: str | None = None,
        reply_to_platform_id: str | None = None,
        parent_id: int | None = None,
        answers: int | None = None,
    ) -> int:
        """Insert one message. ``answers`` marks that user message answered in the same
        transaction (one commit per stored reply)."""
        created = time.time() if created_at is None else created_at
        async with self._tx() as db:
            if parent_id is None and reply_to_platform_id is not None:
                cur = await db.execute(
                    "SELECT id FROM messages WHERE conversation_id = ? AND platform_id = ? "
                    "ORDER BY id DESC LIMIT 1",
                    (conversation_id, reply_to_platform_id),
                )
                row = await cur.fetchone()
                parent_id = row[0] if row else None
            cur = await db.execute(
                "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens,"
                " platform_id, reply_to_platform_id, parent_id, status)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    role,
                    author,
                    text,
                    created,
                    tokens,
                    platform_id,
                    reply_to_platform_id,
                    parent_id,
                    status,
                ),
            )
            assert cur.lastrowid is not None
            if answers is not None:
                await db.execute("UPDATE messages SET status = 'answered' WHERE id = ?", (answers,))
            return cur.lastrowid

    async def pending_messages(
        self, *, since: float, transports: Sequence[str]
    ) -> list[tuple[ConversationKey, StoredMessage]]:
        """User messages stored but never answered (crash, shutdown), oldest first."""
        if not transports:
            return []
        marks = ",".join("?" * len(transports))
        cols = ", ".join(f"m.{c.strip()}" for c in _MSG_COLS.split(","))
        rows = await self._all(
            f"SELECT c.transport, c.person, c.space, {cols} FROM messages m "
            "JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE m.status = 'pending' AND m.role = 'user' AND m.created_at >= ? "
            f"AND c.transport IN ({marks}) AND m.id > c.reset_after ORDER BY m.id",
            (since, *transports),
        )
        return [(ConversationKey(r[0], r[1], r[2]), _msg(r[3:])) for r in rows]

    async def add_messages(
        self, conversation_id: int, rows: Sequence[tuple[str, str, str, int, float]]
    ) -> None:
        """Bulk insert (role, author, text, tokens, created_at) in one transaction."""
        async with self._tx() as db:
            await db.executemany(
                "INSERT INTO messages (conversation_id, role, author, text, tokens, created_at,"
                " status) VALUES (?, ?, ?, ?, ?, ?, 'imported')",
                [(conversation_id, *r) for r in rows],
            )

    async def set_status(
        self, message_id: int, status: str, *, platform_id: str | None = None
    ) -> None:
        async with self._tx() as db:
            await db.execute(
                "UPDATE messages SET status = ?, platform_id = coalesce(?, platform_id) "
                "WHERE id = ?",
                (status, platform_id, message_id),
            )

    async def recent_messages(
        self, conversation: Conversation, *, limit: int, before_id: int | None = None
    ) -> list[StoredMessage]:
        """Newest first, after the reset mark, at most ``limit``."""
        rows = await self._all(
            f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? AND id > ? AND id < ? "
            "ORDER BY id DESC LIMIT ?",
            (conversation.id, conversation.reset_after, before_id or FTS_STRIDE, limit),
        )
        return [_msg(r) for r in rows]

    async def messages_between(
        self, conversation_id: int, *, after_id: int, up_to_id: int
    ) -> list[StoredMessage]:
        rows = await self._all(
            f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? AND id > ? AND id <= ? "
            "ORDER BY id",
            (conversation_id, after_id, up_to_id),
        )
        return [_msg(r) for r in rows]

    async def messages_by_ids(self, ids: Sequence[int]) -> list[StoredMessage]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = await self._all(
            f"SELECT {_MSG_COLS} FROM messages WHERE id IN ({marks}) ORDER BY id", ids
        )
        return [_msg(r) for r in rows]

    async def ancestors(self, message_id: int, *, limit: int) -> list[StoredMessage]:
        """The reply chain above ``message_id`` (its parent, the parent's parent, ...), nearest
        first, at most ``limit``; parents are only ever set within one conversation."""
        rows = await self._all(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT parent_id, 1 FROM messages WHERE id = ? AND parent_id IS NOT NULL"
            " UNION ALL SELECT m.parent_id, c.depth + 1 FROM messages m JOIN chain c"
            " ON m.id = c.id WHERE m.parent_id IS NOT NULL AND c.depth < ?)"
            f" SELECT {', '.join('m.' + c.strip() for c in _MSG_COLS.split(','))}"
            " FROM chain c JOIN messages m ON m.id = c.id ORDER BY c.depth",
            (message_id, limit),
        )
        return [_msg(r) for r in rows]

    async def all_messages(self, conversation_id: int) -> list[StoredMessage]:
        return await self.messages_between(conversation_id, after_id=0, up_to_id=FTS_STRIDE)

    async def count_messages(self, conversation_id: int, *, since_reset: bool = False) -> int:
        row = await self._one(
            "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            "WHERE m.conversation_id = ? AND (? = 0 OR m.id > c.reset_after)",
            (conversation_id, int(since_reset)),
        )
        return int(row[0]) if row else 0

    async def count_person_messages(
        self, transport: str, person: str, *, space: str | None = None
    ) -> int:
        """Messages the person sent on ``transport``: in every space, or in ``space`` only."""
        row = await self._one(
            "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            "WHERE c.transport = ? AND c.person = ? AND m.role = 'user' "
            "AND (? IS NULL OR c.space = ?)",
            (transport, person, space, space),
        )
        return int(row[0]) if row else 0

    # --- full-text search -------------------------------------------------------------------
    async def search_terms(
        self,
        conversation_id: int,
        terms: Sequence[str],
        *,
        after_id: int,
        before_id: int,
        limit_per_term: int = 5000,
    ) -> list[list[int]]:
        """For each term, the ids of this conversation's messages in (after_id, before_id) whose
        text or meta (author, date) contains it, as FTS5 tokenizes and stems it.

        One round trip; each term is its own quoted phrase, so FTS5 syntax in a term is plain
        text. The rowid range confines FTS5 to this conversation's slice of every doclist, and
        no ``bm25()`` is asked for (it would walk each term's doclist across every person's
        messages to count document frequencies): ranking happens in ``bot.memory.retrieval``
        with this conversation's own statistics.
        """
        if not terms:
            return []
        lo = conversation_id * FTS_STRIDE + after_id
        hi = conversation_id * FTS_STRIDE + min(before_id, FTS_STRIDE)
        part = (
            "SELECT * FROM (SELECT {i}, rowid FROM messages_fts "
            "WHERE messages_fts MATCH ? AND rowid > ? AND rowid < ? LIMIT ?)"
        )
        sql = " UNION ALL ".join(part.format(i=i) for i in range(len(terms)))
        params: list[Any] = []
        for term in terms:
            params += ['"' + term.replace('"', '""') + '"', lo, hi, limit_per_term]
        out: list[list[int]] = [[] for _ in terms]
        for i, rowid in await self._all(sql, params):
            out[int(i)].append(int(rowid) - conversation_id * FTS_STRIDE)
        return out

    async def outline(
        self, conversation_id: int, *, after_id: int, before_id: int
    ) -> list[tuple[int, str, int]]:
        """(id, role, tokens) of this conversation's messages in (after_id, before_id), in
        order: the shape retrieval ranks over (lengths, neighbours, question/answer pairs)."""
        rows = await self._all(
            "SELECT id, role, tokens FROM messages WHERE conversation_id = ? AND id > ? "
            "AND id < ? ORDER BY id",
            (conversation_id, after_id, min(before_id, FTS_STRIDE)),
        )
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    # --- vectors (memory.embeddings) --------------------------------------------------------
    async def add_vectors(self, rows: Sequence[tuple[int, int, str, Sequence[float]]]) -> int:
        """Store (message_id, conversation_id, model, vector) rows in one transaction, replacing
        a message's vector of any model; returns how many were stored. A message that is gone
        (forgotten or pruned meanwhile) or not in that conversation is skipped."""
        if not rows:
            return 0
        packed = [(model, len(vec), pack(vec), mid, cid) for mid, cid, model, vec in rows]
        async with self._tx() as db:
            cur = await db.executemany(
                "INSERT OR REPLACE INTO message_vectors "
                "(message_id, conversation_id, model, dim, vector) "
                "SELECT id, conversation_id, ?, ?, ? FROM messages "
                "WHERE id = ? AND conversation_id = ?",
                packed,
            )
            stored = cur.rowcount
            by_conv: dict[int, list[tuple[int, str, Sequence[float]]]] = {}
            for mid, cid, model, vec in rows:
                by_conv.setdefault(cid, []).append((mid, model, vec))
            for cid, items in by_conv.items():
                items.sort(key=lambda item: item[0])
                models = {model for _, model, _ in items}
                dims = {len(vec) for _, _, vec in items}
                if stored != len(rows) or len(models) != 1 or len(dims) != 1:
                    self._vectors.drop([cid])  # unusual; the next search reloads
                    continue
                self._vectors.added(
                    cid,
                    model=items[0][1],
                    ids=[mid for mid, _, _ in items],
                    vectors=as_vectors([vec for _, _, vec in items]),
                )
        return stored

    async def messages_missing_vectors(
        self, model: str, *, limit: int, conversation_id: int | None = None, after_id: int = 0
    ) -> list[StoredMessage]:
        """Messages after their conversation's reset mark with no vector from ``model``,
        oldest first, ids above ``after_id`` (a cursor for paging through a backfill)."""
        scope = "AND m.conversation_id = ? " if conversation_id is not None else ""
        params: list[Any] = [after_id]
        if conversation_id is not None:
            params.append(conversation_id)
        cols = ", ".join(f"m.{c.strip()}" for c in _MSG_COLS.split(","))
        rows = await self._all(
            f"SELECT {cols} FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE m.id > ? {scope}AND m.id > c.reset_after AND NOT EXISTS "
            "(SELECT 1 FROM message_vectors v WHERE v.message_id = m.id AND v.model = ?) "
            "ORDER BY m.id LIMIT ?",
            (*params, model, limit),
        )
        return [_msg(r) for r in rows]

    async def vector_search(
        self,
        conversation_id: int,
        query: Sequence[float],
        *,
        model: str,
        after_id: int,
        before_id: int,
        limit: int,
    ) -> list[tuple[int, float]]:
        """(message id, cosine similarity) best first, among this conversation's messages with
        after_id < id < before_id that have a vector from ``model``. Never reads another
        conversation's vectors; the conversation's matrix is cached between calls."""
        q = unit(as_vectors(query))
        if limit <= 0 or q.ndim != 1 or not q.any():
            return []
        async with self._lock:
            cur = await self._db.execute("PRAGMA data_version")
            row = await cur.fetchone()
            version = int(row[0]) if row else None
            if version != self._data_version:  # another connection wrote: trust nothing cached
                self._vectors.clear()
                self._data_version = version
            matrix = self._vectors.get(conversation_id, model)
            if matrix is None:
                rows = await self._db.execute_fetchall(
                    "SELECT message_id, dim, vector FROM message_vectors "
                    "WHERE conversation_id = ? AND model = ? ORDER BY message_id",
                    (conversation_id, model),
                )
                # ~10-20 ms of copying for 6,000 x 768: off the event loop (numpy drops the GIL)
                matrix = await asyncio.to_thread(VectorMatrix.from_rows, model, rows)
                if matrix is None:
                    return []
                self._vectors.put(conversation_id, matrix)
        return matrix.search(q, after_id=after_id, before_id=before_id, limit=limit)

    # --- summaries --------------------------------------------------------------------------
    async def latest_summary(self, conversation: Conversation) -> Summary | None:
        row = await self._one(
            "SELECT id, text, first_message_id, last_message_id, tokens, created_at "
            "FROM summaries WHERE conversation_id = ? AND first_message_id > ? "
            "ORDER BY id DESC LIMIT 1",
            (conversation.id, conversation.reset_after),
        )
        return None if row is None else Summary(*row)

    async def save_summary(
        self,
        conversation_id: int,
        *,
        text: str,
        first_message_id: int,
        last_message_id: int,
        tokens: int,
    ) -> bool:
        """Store a summary unless a reset happened after ``first_message_id`` was chosen."""
        async with self._tx() as db:
            cur = await db.execute(
                "SELECT reset_after FROM conversations WHERE id = ?", (conversation_id,)
            )
            row = await cur.fetchone()
            if row is None or first_message_id <= row[0]:
                return False
            await db.execute(
                "INSERT INTO summaries (conversation_id, text, first_message_id, "
                "last_message_id, tokens, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, text, first_message_id, last_message_id, tokens, time.time()),
            )
            # Older summaries are superseded; keep the log as the record, not stale digests.
            await db.execute(
                "DELETE FROM summaries WHERE conversation_id = ? AND id < last_insert_rowid()",
                (conversation_id,),
            )
            return True

    # --- facts ------------------------------------------------------------------------------
    async def facts(self, conversation_id: int) -> list[Fact]:
        rows = await self._all(
            "SELECT id, text, tokens, created_at FROM facts WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        return [Fact(*r) for r in rows]

    async def add_fact(self, conversation_id: int, *, text: str, tokens: int) -> int:
        async with self._tx() as db:
            cur = await db.execute(
                "INSERT INTO facts (conversation_id, text, tokens, created_at) VALUES (?, ?, ?, ?)",
                (conversation_id, text, tokens, time.time()),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    async def remove_fact(self, conversation_id: int, fact_id: int) -> bool:
        async with self._tx() as db:
            cur = await db.execute(
                "DELETE FROM facts WHERE conversation_id = ? AND id = ?",
                (conversation_id, fact_id),
            )
            return cur.rowcount > 0

    # --- operations -------------------------------------------------------------------------
    async def tidy(self) -> None:
        """Upkeep for idle moments: checkpoint the WAL, do a little FTS5 merge work."""
        async with self._lock:
            await self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            await self._db.execute(
                "INSERT INTO messages_fts (messages_fts, rank) VALUES ('merge', ?)",
                (FTS_MERGE_PAGES,),
            )
            wal = self.path.with_name(self.path.name + "-wal")
            with contextlib.suppress(OSError):
                if wal.stat().st_size > WAL_FORCE_BYTES:
                    await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def ping(self) -> None:
        """One trivial query through the lock and the connection's thread (the watchdog's
        proof that the store is not wedged)."""
        await self._one("SELECT 1")

    async def messages_since(self, since: float) -> dict[str, int]:
        """Messages per role created at or after ``since`` (the status file's daily counts)."""
        rows = await self._all(
            "SELECT role, count(*) FROM messages WHERE created_at >= ? GROUP BY role", (since,)
        )
        return {str(r[0]): int(r[1]) for r in rows}

    async def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for table in ("conversations", "messages", "summaries", "facts"):
            row = await self._one(f"SELECT count(*) FROM {table}")
            out[table] = int(row[0]) if row else 0
        return out

    async def prune_older_than(self, cutoff: float, *, batch: int = 500) -> int:
        """Retention: delete messages created before ``cutoff`` in small batches (no long lock)."""
        total = 0
        while True:
            async with self._tx() as db:
                cur = await db.execute(
                    "DELETE FROM messages WHERE id IN (SELECT id FROM messages "
                    "WHERE created_at < ? ORDER BY created_at LIMIT ?)",
                    (cutoff, batch),
                )
                n = cur.rowcount
                if n:
                    self._vectors.clear()  # pruned messages took their vectors with them
            total += n
            if n < batch:
                return total
            await asyncio.sleep(0)


async def _backup_before_upgrade(db: aiosqlite.Connection, path: Path, first: str) -> None:
    target = path.with_name(f"{path.name}.before-{first}.bak")
    private_file(target)
    copy = sqlite3.connect(target, check_same_thread=False)
    try:
        await db.backup(copy)
    finally:
        copy.close()
    log.info("database %s: backup before migration %s written to %s", path, first, target)


def _explain_db_error(path: Path, exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return (
            f"the database {path} is damaged ({text}). Fix: stop the bot, move the file aside "
            "(keep it for recovery: `sqlite3 FILE .recover`), and start again to create a new one."
        )
    if "readonly" in text or "read-only" in text:
        return (
            f"the database {path} cannot be written ({text}). Fix: make the file and its "
            "directory writable for this user."
        )
    if "unable to open" in text:
        return (
            f"cannot open the database {path} ({text}). Fix: check that the state directory "
            "exists and is writable, or set MESHSAGE_STATE_DIR."
        )
    return f"database error on {path}: {text}. Fix: check the file and its directory."
