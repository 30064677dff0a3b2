"""Conversations and the raw message log (the ground truth).

Invariants:
- ``reset_after`` on a conversation hides everything up to that message id from context
  (window, summaries, retrieval); messages are never edited except their delivery status and
  platform id.
- ``add_message(answers=...)`` marks the question answered in the same transaction.
- A user message whose platform id this conversation already stored within
  ``HEARD_WINDOW_SECONDS`` raises ``AlreadyStored`` and stores nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bot.domain import ConversationKey
from bot.memory.records import (
    HEARD_WINDOW_SECONDS,
    MSG_COLS,
    AlreadyStored,
    Conversation,
    StoredMessage,
    msg_from_row,
)
from bot.memory.schema import FTS_STRIDE
from bot.memory.sqlite.base import SqliteBase


class MessagesMixin(SqliteBase):
    # --- conversations ----------------------------------------------------------------------
    async def conversation(self, key: ConversationKey) -> Conversation:
        """Get or create the conversation for ``key`` (a linked DM resolves to the joined one)."""
        found = await self.find_conversation(key)
        if found is not None:
            return found
        async with self._tx() as db:
            await db.execute(
                "INSERT OR IGNORE INTO conversations (transport, person, space, created_at) "
                "VALUES (?, ?, ?, ?)",
                (key.transport, key.person, key.space, time.time()),
            )
        found = await self.find_conversation(key)
        assert found is not None
        return found

    async def find_conversation(self, key: ConversationKey) -> Conversation | None:
        row = await self._one(
            "SELECT c.id, c.reset_after, h.id, h.transport, h.person, h.space, h.reset_after "
            "FROM conversations c LEFT JOIN conversations h ON h.id = c.merged_into "
            "WHERE c.transport = ? AND c.person = ? AND c.space = ?",
            (key.transport, key.person, key.space),
        )
        if row is None:
            return None
        if row[2] is not None:  # linked: memory lives in the other transport's DM
            home = ConversationKey(row[3], row[4], row[5])
            return Conversation(id=row[2], key=home, reset_after=row[6], origin_id=row[0])
        return Conversation(id=row[0], key=key, reset_after=row[1])

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
        origin_id: int | None = None,
    ) -> int:
        """Insert one message. ``answers`` marks that user message answered in the same
        transaction (one commit per stored reply). ``origin_id`` (``Conversation.origin_id``)
        records the linked DM it arrived in; if that link was undone meanwhile (``!unlink``
        during a turn) the message goes to its own conversation instead. A user message heard
        before (same platform id within ``HEARD_WINDOW_SECONDS``) raises ``AlreadyStored``."""
        created = time.time() if created_at is None else created_at
        async with self._tx() as db:
            if origin_id is not None:
                cur = await db.execute(
                    "SELECT merged_into FROM conversations WHERE id = ?", (origin_id,)
                )
                link = await cur.fetchone()
                if link is None or link[0] != conversation_id:
                    conversation_id, origin_id = origin_id, None
            if role == "user" and platform_id is not None:
                cur = await db.execute(
                    "SELECT 1 FROM messages WHERE conversation_id = ? AND platform_id = ? "
                    "AND role = 'user' AND created_at >= ? LIMIT 1",
                    (conversation_id, platform_id, created - HEARD_WINDOW_SECONDS),
                )
                if await cur.fetchone() is not None:
                    raise AlreadyStored(conversation_id, platform_id)
            if parent_id is None and reply_to_platform_id is not None:
                cur = await db.execute(
                    "SELECT id FROM messages WHERE conversation_id = ? AND platform_id = ? "
                    "ORDER BY id DESC LIMIT 1",
                    (conversation_id, reply_to_platform_id),
                )
                row = await cur.fetchone()
                if row is None:  # a later part of a multi-message answer
                    cur = await db.execute(
                        "SELECT m.id FROM outbox_parts p JOIN outbox o ON o.id = p.outbox_id "
                        "JOIN messages m ON m.id = o.answer_id "
                        "WHERE p.platform_id = ? AND m.conversation_id = ? "
                        "ORDER BY m.id DESC LIMIT 1",
                        (reply_to_platform_id, conversation_id),
                    )
                    row = await cur.fetchone()
                parent_id = row[0] if row else None
            cur = await db.execute(
                "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens,"
                " platform_id, reply_to_platform_id, parent_id, status, origin_conversation_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    origin_id,
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
        cols = ", ".join(f"m.{c.strip()}" for c in MSG_COLS.split(","))
        rows = await self._all(
            f"SELECT c.transport, c.person, c.space, {cols} FROM messages m "
            # a message sent through a linked DM is answered on the transport it came from
            "JOIN conversations c ON c.id = coalesce(m.origin_conversation_id, m.conversation_id) "
            f"WHERE m.status = 'pending' AND m.role = 'user' AND m.created_at >= ? "
            f"AND c.transport IN ({marks}) AND m.id > c.reset_after "
            # a later question's turn folds this one in: never answered on its own after it
            "AND NOT EXISTS (SELECT 1 FROM messages l WHERE l.conversation_id = "
            "m.conversation_id AND l.role = 'user' AND l.id > m.id) ORDER BY m.id",
            (since, *transports),
        )
        return [(ConversationKey(r[0], r[1], r[2]), msg_from_row(r[3:])) for r in rows]

    async def known_platform_ids(
        self, transport: str, platform_ids: Sequence[str], *, since: float
    ) -> set[str]:
        """Which of ``platform_ids`` are stored for ``transport`` in messages created at or
        after ``since`` (the window bounds the scan: created_at is indexed)."""
        if not platform_ids:
            return set()
        marks = ",".join("?" * len(platform_ids))
        rows = await self._all(
            "SELECT m.platform_id FROM messages m JOIN conversations c "
            "ON c.id = m.conversation_id WHERE m.created_at >= ? AND c.transport = ? "
            f"AND m.platform_id IN ({marks})",
            (since, transport, *platform_ids),
        )
        return {str(r[0]) for r in rows}

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

    async def mark_answered(self, conversation_id: int, ids: Sequence[int]) -> int:
        """Mark still-pending user messages of the conversation answered (a turn folded them
        into its prompt and answered them with its own question)."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        async with self._tx() as db:
            cur = await db.execute(
                "UPDATE messages SET status = 'answered' WHERE conversation_id = ? AND role = "
                f"'user' AND status = 'pending' AND id IN ({marks})",
                [conversation_id, *ids],
            )
            return cur.rowcount

    async def claim_question(self, message_id: int, *, stale_before: float) -> bool:
        """Compare-and-set: take a pending question for this process unless another holder's
        claim is newer than ``stale_before`` (bot.memory.keep). One process owns a SQLite
        file, so the holder is always this one."""
        async with self._tx() as db:
            cur = await db.execute(
                "UPDATE messages SET claimed_by = 'local', claimed_at = ? WHERE id = ? AND "
                "status = 'pending' AND (claimed_by IS NULL OR claimed_by = 'local' OR "
                "claimed_at < ?)",
                (time.time(), message_id, stale_before),
            )
            return cur.rowcount == 1

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
        """Newest first, after the reset mark, at most ``limit``. With ``before_id`` (the
        message being answered): the conversation as it stands for that message, i.e. the
        messages before it plus the answers to them, even when an answer was stored after it
        (a second question sent before the first was answered)."""
        before = before_id or FTS_STRIDE
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = ? AND id > ? AND "
            "(id < ? OR (role = 'assistant' AND parent_id IS NOT NULL AND parent_id < ?)) "
            "ORDER BY id DESC LIMIT ?",
            (conversation.id, conversation.reset_after, before, before, limit),
        )
        return [msg_from_row(r) for r in rows]

    async def messages_between(
        self, conversation_id: int, *, after_id: int, up_to_id: int
    ) -> list[StoredMessage]:
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = ? AND id > ? AND id <= ? "
            "ORDER BY id",
            (conversation_id, after_id, up_to_id),
        )
        return [msg_from_row(r) for r in rows]

    async def message_by_platform_id(self, conversation_id: int, platform_id: str) -> int | None:
        row = await self._one(
            "SELECT id FROM messages WHERE conversation_id = ? AND platform_id = ? "
            "ORDER BY id DESC LIMIT 1",
            (conversation_id, platform_id),
        )
        return None if row is None else int(row[0])

    async def messages_by_ids(self, ids: Sequence[int]) -> list[StoredMessage]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE id IN ({marks}) ORDER BY id", ids
        )
        return [msg_from_row(r) for r in rows]

    async def ancestors(self, message_id: int, *, limit: int) -> list[StoredMessage]:
        """The reply chain above ``message_id`` (its parent, the parent's parent, ...), nearest
        first, at most ``limit``; parents are only ever set within one conversation."""
        rows = await self._all(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT parent_id, 1 FROM messages WHERE id = ? AND parent_id IS NOT NULL"
            " UNION ALL SELECT m.parent_id, c.depth + 1 FROM messages m JOIN chain c"
            " ON m.id = c.id WHERE m.parent_id IS NOT NULL AND c.depth < ?)"
            f" SELECT {', '.join('m.' + c.strip() for c in MSG_COLS.split(','))}"
            " FROM chain c JOIN messages m ON m.id = c.id ORDER BY c.depth",
            (message_id, limit),
        )
        return [msg_from_row(r) for r in rows]

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
