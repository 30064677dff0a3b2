"""Ordered, named schema migrations, recorded in ``schema_migrations``.

Invariants:
- Migrations only ever append to ``MIGRATIONS``; an applied migration is never edited.
- Each migration runs in its own transaction together with its bookkeeping row.
- The FTS5 index is contentless and kept in sync by triggers only; its rowid is
  ``conversation_id * FTS_STRIDE + message_id`` so that a query scoped to one conversation is a
  rowid *range* that FTS5 seeks to, instead of matching every person's messages and filtering.
- The indexed ``meta`` column (author and date) is derived from the row by the same SQL
  expression on insert and delete, so the contentless 'delete' command always removes exactly
  what was inserted.
"""

from __future__ import annotations

import sqlite3

import aiosqlite

from bot.memory.core import ddl
from bot.memory.core.versions import check_versions

FTS_STRIDE = 1 << 32  # message ids stay below this per conversation range

_MONTHS = " ".join(
    f"WHEN '{i:02d}' THEN '{name}'"
    for i, name in enumerate(
        [
            "January", "February", "March", "April", "May", "June",
            "July", "August", "September", "October", "November", "December",
        ],
        start=1,
    )
)  # fmt: skip


def _meta_sql(row: str) -> str:
    ts = f"{row}.created_at, 'unixepoch'"
    return (
        f"{row}.author || ' ' || CAST(strftime('%d', {ts}) AS INTEGER) || ' ' || "
        f"(CASE strftime('%m', {ts}) {_MONTHS} END) || ' ' || strftime('%Y', {ts})"
    )


def _fts_rowid(row: str) -> str:
    return f"{row}.conversation_id * {FTS_STRIDE} + {row}.id"


def _m001_initial() -> str:
    return f"""
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            transport TEXT NOT NULL,
            person TEXT NOT NULL,
            space TEXT NOT NULL,
            created_at REAL NOT NULL,
            reset_after INTEGER NOT NULL DEFAULT 0,
            UNIQUE (transport, person, space)
        );
        CREATE INDEX conversations_person ON conversations (transport, person);

        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            author TEXT NOT NULL,
            text TEXT NOT NULL,
            created_at REAL NOT NULL,
            tokens INTEGER NOT NULL CHECK (tokens >= 0),
            platform_id TEXT,
            reply_to_platform_id TEXT,
            parent_id INTEGER REFERENCES messages (id) ON DELETE SET NULL,
            status TEXT NOT NULL
        );
        CREATE INDEX messages_conversation ON messages (conversation_id, id);
        CREATE INDEX messages_platform ON messages (conversation_id, platform_id)
            WHERE platform_id IS NOT NULL;
        CREATE INDEX messages_parent ON messages (parent_id) WHERE parent_id IS NOT NULL;
        CREATE INDEX messages_created ON messages (created_at);
        CREATE INDEX messages_pending ON messages (created_at) WHERE status = 'pending';

        CREATE TABLE summaries (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            first_message_id INTEGER NOT NULL,
            last_message_id INTEGER NOT NULL,
            tokens INTEGER NOT NULL,
            created_at REAL NOT NULL,
            CHECK (first_message_id <= last_message_id)
        );
        CREATE INDEX summaries_conversation ON summaries (conversation_id, id);

        CREATE TABLE facts (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX facts_conversation ON facts (conversation_id, id);

        CREATE VIRTUAL TABLE messages_fts USING fts5 (
            body, meta, content='', tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts (rowid, body, meta)
            VALUES ({_fts_rowid("new")}, new.text, {_meta_sql("new")});
        END;
        CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts (messages_fts, rowid, body, meta)
            VALUES ('delete', {_fts_rowid("old")}, old.text, {_meta_sql("old")});
        END;
        CREATE TRIGGER messages_fts_update AFTER UPDATE OF text, author, created_at, conversation_id
        ON messages BEGIN
            INSERT INTO messages_fts (messages_fts, rowid, body, meta)
            VALUES ('delete', {_fts_rowid("old")}, old.text, {_meta_sql("old")});
            INSERT INTO messages_fts (rowid, body, meta)
            VALUES ({_fts_rowid("new")}, new.text, {_meta_sql("new")});
        END;
        """


def _m002_message_vectors() -> str:
    # One vector per message (float32 little-endian); a new model replaces it. Rows go with
    # their message (cascade), so forget and retention need no extra step.
    return """
        CREATE TABLE message_vectors (
            message_id INTEGER PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
            conversation_id INTEGER NOT NULL,
            model TEXT NOT NULL,
            dim INTEGER NOT NULL CHECK (dim > 0),
            vector BLOB NOT NULL CHECK (length(vector) = 4 * dim)
        );
        CREATE INDEX message_vectors_conversation ON message_vectors (conversation_id, message_id);
        """


def _m003_outbox() -> str:
    # The durable outbox: what must still reach someone, with per-part progress. Rows are
    # keyed by (transport, person, space) rather than a conversation id so a notice for a
    # message that could not be stored still has a row; ``!forget`` deletes them by person.
    # ``scrub_pending`` records an unfinished ``!forget`` erase (finished at the next open).
    return """
        CREATE TABLE outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            transport TEXT NOT NULL,
            person TEXT NOT NULL,
            space TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('answer', 'notice', 'command', 'more')),
            text TEXT NOT NULL,
            reply_to TEXT,
            question_id INTEGER REFERENCES messages (id) ON DELETE SET NULL,
            answer_id INTEGER REFERENCES messages (id) ON DELETE SET NULL,
            rest TEXT,
            state TEXT NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'sent', 'delivered', 'failed', 'expired')),
            detail TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX outbox_pending ON outbox (transport, id) WHERE state = 'pending';
        CREATE INDEX outbox_person ON outbox (transport, person, space, id);
        CREATE TABLE outbox_parts (
            outbox_id INTEGER NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
            part INTEGER NOT NULL CHECK (part >= 0),
            platform_id TEXT NOT NULL,
            PRIMARY KEY (outbox_id, part)
        );
        CREATE TABLE scrub_pending (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            since REAL NOT NULL
        );
        """


def _m004_memory_tiers() -> str:
    # Sessions (closed by an idle gap or !reset) with their short summaries, long-term summary
    # versions rebuilt from them (each records the last message its sessions cover, so the
    # prompt can keep one version until the window's base moves past the next), facts with
    # provenance (pinned = !remember), forgetting by use (uses, important), linked identities
    # (merged_into on the absorbed DM conversation, origin_conversation_id on what was moved so
    # !unlink can give it back) and incognito. Existing facts all came from !remember, so they
    # start pinned.
    return """
        CREATE TABLE sessions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            origin_conversation_id INTEGER,
            first_message_id INTEGER NOT NULL,
            last_message_id INTEGER NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL NOT NULL,
            messages INTEGER NOT NULL CHECK (messages >= 0),
            title TEXT,
            summary TEXT,
            tokens INTEGER NOT NULL DEFAULT 0,
            CHECK (first_message_id <= last_message_id)
        );
        CREATE INDEX sessions_conversation ON sessions (conversation_id, last_message_id);

        CREATE TABLE longterm_summaries (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            sessions INTEGER NOT NULL,
            up_to_message_id INTEGER NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX longterm_conversation
            ON longterm_summaries (conversation_id, up_to_message_id);

        ALTER TABLE facts ADD COLUMN pinned INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE facts ADD COLUMN source_ids TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE facts ADD COLUMN updated_at REAL;
        ALTER TABLE facts ADD COLUMN origin_conversation_id INTEGER;

        ALTER TABLE messages ADD COLUMN uses INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE messages ADD COLUMN important INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE messages ADD COLUMN origin_conversation_id INTEGER;

        ALTER TABLE conversations ADD COLUMN merged_into INTEGER
            REFERENCES conversations (id) ON DELETE SET NULL;
        ALTER TABLE conversations ADD COLUMN incognito INTEGER NOT NULL DEFAULT 0;
        """


def _m005_outbox_parts_platform() -> str:
    # A reply to any part of a multi-message answer (Discord) is resolved by the part's
    # platform id (bot.memory.core.messages.add_message), after a restart too.
    return "CREATE INDEX outbox_parts_platform ON outbox_parts (platform_id);"


Migration = ddl.Migration

MIGRATIONS: list[Migration] = [
    ("001_initial", _m001_initial),
    ("002_message_vectors", _m002_message_vectors),
    ("003_outbox", _m003_outbox),
    ("004_memory_tiers", _m004_memory_tiers),
    ("005_outbox_parts_platform", _m005_outbox_parts_platform),
    *ddl.notes_and_claims(ddl.SQLITE),  # written once for both backends
    *ddl.stretches_and_shown(ddl.SQLITE),
    *ddl.link_facts(ddl.SQLITE),
    *ddl.commands_held(ddl.SQLITE),
    *ddl.fact_changes(ddl.SQLITE),
    *ddl.chat_settings(ddl.SQLITE),
    *ddl.commands_marked(ddl.SQLITE),
    *ddl.pins(ddl.SQLITE),
]


async def applied_migrations(db: aiosqlite.Connection) -> set[str]:
    """Names already applied (empty for a new database)."""
    try:
        async with db.execute("SELECT name FROM schema_migrations") as cur:
            return {row[0] for row in await cur.fetchall()}
    except sqlite3.OperationalError:  # no table yet: a new database
        return set()


async def migrate(db: aiosqlite.Connection, migrations: list[Migration] | None = None) -> list[str]:
    """Apply pending migrations in order; return the names applied.

    Each migration's SQL and its bookkeeping row run in one script wrapped in BEGIN/COMMIT
    (executescript would otherwise commit statement by statement), so a failure leaves the
    database at the previous version.
    """
    migrations = MIGRATIONS if migrations is None else migrations
    await db.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(name TEXT PRIMARY KEY,"
        " applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0))"
    )
    async with db.execute("SELECT name FROM schema_migrations") as cur:
        done = {row[0] for row in await cur.fetchall()}
    # (SqliteStore.open refused an unfinished migrate-store copy already, unless asked to copy)
    check_versions(done, [m[0] for m in MIGRATIONS], "this database file", copying=True)
    applied = []
    for name, sql in migrations:
        if name in done:
            continue
        if "'" in name:
            raise ValueError(f"migration name {name!r} must not contain quotes")
        try:
            await db.executescript(
                f"BEGIN IMMEDIATE;\n{sql()}\n;"
                f"INSERT INTO schema_migrations (name) VALUES ('{name}');\nCOMMIT;"
            )
        except BaseException:
            if db.in_transaction:
                await db.rollback()
            raise
        applied.append(name)
    return applied
