"""Conversations and the raw message log (the ground truth), on PostgreSQL.

Invariants (as ``bot.memory.sqlite.messages``, plus what several gateways need):
- ``reset_after`` hides everything up to that message id; messages are never edited except
  their delivery status and platform id.
- ``add_message(answers=...)`` marks the question answered in the same transaction.
- A user message whose platform id this conversation already heard within
  ``HEARD_WINDOW_SECONDS`` raises ``AlreadyStored`` and stores nothing: the ``heard`` row's
  primary key makes that hold across processes (two gateways hearing one radio packet).
- The search words are written with the row, in the same statement (``words.fold``), keyed
  by the row's conversation (``meshsage_keyed``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bot.domain import ConversationKey
from bot.memory.postgres.base import PgBase
from bot.memory.postgres.words import fold, meta
from bot.memory.records import (
    HEARD_WINDOW_SECONDS,
    MSG_COLS,
    AlreadyStored,
    Conversation,
    StoredMessage,
    msg_from_row,
)

MAX_ID = (1 << 63) - 1
M_COLS = ", ".join(f"m.{c.strip()}" for c in MSG_COLS.split(","))
# A message's search words, keyed by its conversation (see schema 002_keyed_search).
SEARCH_SQL = (
    "meshsage_keyed(${c}::bigint, to_tsvector('meshsage', ${a}) || to_tsvector('meshsage', ${b}))"
)


class MessagesMixin(PgBase):
    # --- conversations ----------------------------------------------------------------------
    async def conversation(self, key: ConversationKey) -> Conversation:
        """Get or create the conversation for ``key`` (a linked DM resolves to the joined one)."""
        found = await self.find_conversation(key)
        if found is not None:
            return found
        async with self._tx() as con:  # gateways may race to create it: the unique key wins
            await con.execute(
                "INSERT INTO conversations (transport, person, space, created_at) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (transport, person, space) DO NOTHING",
                key.transport,
                key.person,
                key.space,
                time.time(),
            )
        found = await self.find_conversation(key)
        assert found is not None
        return found

    async def find_conversation(self, key: ConversationKey) -> Conversation | None:
        row = await self._one(
            "SELECT c.id, c.reset_after, h.id, h.transport, h.person, h.space, h.reset_after "
            "FROM conversations c LEFT JOIN conversations h ON h.id = c.merged_into "
            "WHERE c.transport = $1 AND c.person = $2 AND c.space = $3",
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
            "WHERE transport = $1 AND person = $2 ORDER BY id",
            (transport, person),
        )
        return [Conversation(r[0], ConversationKey(transport, person, r[1]), r[2]) for r in rows]

    async def reset(self, conversation_id: int) -> int:
        """Start a fresh conversation: everything so far leaves the context. Returns the mark."""
        async with self._tx() as con:
            await con.execute(
                "SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE", conversation_id
            )
            mark = int(
                await con.fetchval(
                    "SELECT coalesce(max(id), 0) FROM messages WHERE conversation_id = $1",
                    conversation_id,
                )
            )
            await con.execute(
                "UPDATE conversations SET reset_after = greatest(reset_after, $1) WHERE id = $2",
                mark,
                conversation_id,
            )
        return mark

    async def reset_mark(self, conversation_id: int) -> int:
        value = await self._val(
            "SELECT reset_after FROM conversations WHERE id = $1", (conversation_id,)
        )
        return int(value) if value is not None else 0

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
        transaction; ``origin_id`` records the linked DM it arrived in (its own conversation
        if the link was undone meanwhile); a user message heard before raises
        ``AlreadyStored``."""
        created = time.time() if created_at is None else created_at
        async with self._tx() as con:
            if origin_id is not None:
                link = await con.fetchrow(
                    "SELECT merged_into FROM conversations WHERE id = $1", origin_id
                )
                if link is None or link[0] != conversation_id:
                    conversation_id, origin_id = origin_id, None
            if role == "user" and platform_id is not None:
                fresh = await con.fetchval(
                    "INSERT INTO heard (conversation_id, platform_id, heard_at) "
                    "VALUES ($1, $2, $3) ON CONFLICT (conversation_id, platform_id) DO UPDATE "
                    "SET heard_at = EXCLUDED.heard_at WHERE heard.heard_at < $4 RETURNING 1",
                    conversation_id,
                    platform_id,
                    created,
                    created - HEARD_WINDOW_SECONDS,
                )
                if fresh is None:
                    raise AlreadyStored(conversation_id, platform_id)
            if parent_id is None and reply_to_platform_id is not None:
                parent_id = await con.fetchval(
                    "SELECT id FROM messages WHERE conversation_id = $1 AND platform_id = $2 "
                    "ORDER BY id DESC LIMIT 1",
                    conversation_id,
                    reply_to_platform_id,
                )
            new_id = await con.fetchval(
                "INSERT INTO messages (conversation_id, role, author, text, created_at, tokens,"
                " platform_id, reply_to_platform_id, parent_id, status, origin_conversation_id,"
                " search) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $13,"
                f" {SEARCH_SQL.format(c=1, a=11, b=12)}) RETURNING id",
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
                fold(text),
                fold(meta(author, created)),
                origin_id,
            )
            if answers is not None:
                await con.execute("UPDATE messages SET status = 'answered' WHERE id = $1", answers)
            return int(new_id)

    async def pending_messages(
        self, *, since: float, transports: Sequence[str]
    ) -> list[tuple[ConversationKey, StoredMessage]]:
        """User messages stored but never answered (crash, shutdown), oldest first."""
        if not transports:
            return []
        rows = await self._all(
            f"SELECT c.transport, c.person, c.space, {M_COLS} FROM messages m "
            # a message sent through a linked DM is answered on the transport it came from
            "JOIN conversations c ON c.id = coalesce(m.origin_conversation_id, m.conversation_id) "
            "WHERE m.status = 'pending' AND m.role = 'user' AND m.created_at >= $1 "
            "AND c.transport = ANY($2::text[]) AND m.id > c.reset_after "
            # a later question's turn folds this one in: never answered on its own after it
            "AND NOT EXISTS (SELECT 1 FROM messages l WHERE l.conversation_id = "
            "m.conversation_id AND l.role = 'user' AND l.id > m.id) ORDER BY m.id",
            (since, list(transports)),
        )
        return [(ConversationKey(r[0], r[1], r[2]), msg_from_row(tuple(r)[3:])) for r in rows]

    async def mark_answered(self, conversation_id: int, ids: Sequence[int]) -> int:
        """Mark still-pending user messages of the conversation answered (a turn folded them
        into its prompt and answered them with its own question)."""
        if not ids:
            return 0
        value = await self._val(
            "WITH done AS (UPDATE messages SET status = 'answered' WHERE conversation_id = $1 "
            "AND role = 'user' AND status = 'pending' AND id = ANY($2::bigint[]) RETURNING 1) "
            "SELECT count(*) FROM done",
            (conversation_id, list(ids)),
        )
        return int(value or 0)

    async def claim_question(self, message_id: int, *, stale_before: float) -> bool:
        """Compare-and-set: take a pending question for this gateway unless another gateway's
        claim is newer than ``stale_before`` (bot.memory.keep: its gateway may still be at
        work). Two gateways racing for it: the row lock makes one win."""
        value = await self._val(
            "WITH took AS (UPDATE messages SET claimed_by = $1, claimed_at = $2 WHERE id = $3 "
            "AND status = 'pending' AND (claimed_by IS NULL OR claimed_by = $1 OR "
            "claimed_at < $4) RETURNING 1) SELECT count(*) FROM took",
            (self.gateway, time.time(), message_id, stale_before),
        )
        return bool(value)

    async def known_platform_ids(
        self, transport: str, platform_ids: Sequence[str], *, since: float
    ) -> set[str]:
        """Which of ``platform_ids`` are stored for ``transport`` in messages created at or
        after ``since`` (the window bounds the scan: created_at is indexed)."""
        if not platform_ids:
            return set()
        rows = await self._all(
            "SELECT m.platform_id FROM messages m JOIN conversations c "
            "ON c.id = m.conversation_id WHERE m.created_at >= $1 AND c.transport = $2 "
            "AND m.platform_id = ANY($3::text[])",
            (since, transport, list(platform_ids)),
        )
        return {str(r[0]) for r in rows}

    async def add_messages(
        self, conversation_id: int, rows: Sequence[tuple[str, str, str, int, float]]
    ) -> None:
        """Bulk insert (role, author, text, tokens, created_at) in one transaction."""
        async with self._tx() as con:
            await con.executemany(
                "INSERT INTO messages (conversation_id, role, author, text, tokens, created_at,"
                f" status, search) VALUES ($1, $2, $3, $4, $5, $6, 'imported',"
                f" {SEARCH_SQL.format(c=1, a=7, b=8)})",
                [
                    (conversation_id, role, author, text, tokens, created, fold(text),
                     fold(meta(author, created)))
                    for role, author, text, tokens, created in rows
                ],
            )  # fmt: skip

    async def set_status(
        self, message_id: int, status: str, *, platform_id: str | None = None
    ) -> None:
        async with self._tx() as con:
            await con.execute(
                "UPDATE messages SET status = $1, platform_id = coalesce($2, platform_id) "
                "WHERE id = $3",
                status,
                platform_id,
                message_id,
            )

    async def recent_messages(
        self, conversation: Conversation, *, limit: int, before_id: int | None = None
    ) -> list[StoredMessage]:
        """Newest first, after the reset mark, at most ``limit``. With ``before_id`` (the
        message being answered): the messages before it plus the answers to them, even when an
        answer was stored after it (a second question sent before the first was answered)."""
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = $1 AND id > $2 AND "
            "(id < $3 OR (role = 'assistant' AND parent_id IS NOT NULL AND parent_id < $3)) "
            "ORDER BY id DESC LIMIT $4",
            (conversation.id, conversation.reset_after, before_id or MAX_ID, limit),
        )
        return [msg_from_row(r) for r in rows]

    async def messages_between(
        self, conversation_id: int, *, after_id: int, up_to_id: int
    ) -> list[StoredMessage]:
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = $1 AND id > $2 "
            "AND id <= $3 ORDER BY id",
            (conversation_id, after_id, min(up_to_id, MAX_ID)),
        )
        return [msg_from_row(r) for r in rows]

    async def message_by_platform_id(self, conversation_id: int, platform_id: str) -> int | None:
        value = await self._val(
            "SELECT id FROM messages WHERE conversation_id = $1 AND platform_id = $2 "
            "ORDER BY id DESC LIMIT 1",
            (conversation_id, platform_id),
        )
        return None if value is None else int(value)

    async def messages_by_ids(self, ids: Sequence[int]) -> list[StoredMessage]:
        if not ids:
            return []
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE id = ANY($1::bigint[]) ORDER BY id",
            (list(ids),),
        )
        return [msg_from_row(r) for r in rows]

    async def ancestors(self, message_id: int, *, limit: int) -> list[StoredMessage]:
        """The reply chain above ``message_id``, nearest first, at most ``limit``."""
        rows = await self._all(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT parent_id, 1 FROM messages WHERE id = $1 AND parent_id IS NOT NULL"
            " UNION ALL SELECT m.parent_id, c.depth + 1 FROM messages m JOIN chain c"
            " ON m.id = c.id WHERE m.parent_id IS NOT NULL AND c.depth < $2)"
            f" SELECT {M_COLS} FROM chain c JOIN messages m ON m.id = c.id ORDER BY c.depth",
            (message_id, limit),
        )
        return [msg_from_row(r) for r in rows]

    async def all_messages(self, conversation_id: int) -> list[StoredMessage]:
        return await self.messages_between(conversation_id, after_id=0, up_to_id=MAX_ID)

    async def count_messages(self, conversation_id: int, *, since_reset: bool = False) -> int:
        value = await self._val(
            "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            "WHERE m.conversation_id = $1 AND (NOT $2 OR m.id > c.reset_after)",
            (conversation_id, since_reset),
        )
        return int(value or 0)

    async def count_person_messages(
        self, transport: str, person: str, *, space: str | None = None
    ) -> int:
        """Messages the person sent on ``transport``: in every space, or in ``space`` only."""
        value = await self._val(
            "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            "WHERE c.transport = $1 AND c.person = $2 AND m.role = 'user' "
            "AND ($3::text IS NULL OR c.space = $3)",
            (transport, person, space),
        )
        return int(value or 0)
