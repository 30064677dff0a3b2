"""Conversations and the raw message log (the ground truth), for both backends.

Invariants:
- ``reset_after`` on a conversation hides everything up to that message id from context
  (window, summaries, retrieval); messages are never edited except their delivery status,
  platform id and claim, and a person's edit of their own message (``edit_message``: text and
  search words together, vectors dropped; a reopened question's answers withdrawn).
- ``add_message(answers=...)`` marks the question answered in the same transaction;
  ``origin_id`` records the linked DM a message arrived in, or the message goes to that DM's
  own conversation when the link was undone meanwhile (``!unlink`` during a turn).
- A user message whose platform id this conversation already heard within
  ``HEARD_WINDOW_SECONDS`` raises ``AlreadyStored`` and stores nothing
  (``Dialect.heard_fresh``: SQLite looks in ``messages``, one process owns the file;
  PostgreSQL claims the ``heard`` row, whose primary key makes it hold across gateways).
- A message's search words are written with its row (``CoreBase._search_column``: nothing
  on SQLite, whose FTS triggers index it; the ``search`` column on PostgreSQL).
- Round trips: a message without ``origin_id`` or ``answers`` (every message a turn stores
  through the responder outside linked DMs) is ONE statement, so one round trip and no
  explicit transaction on either backend: the heard check, the reply's parent lookup and the
  search words are parts of its INSERT. The rest run in one ``_atomic()`` transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bot.domain import ConversationKey
from bot.memory.core.db import MAX_ID, CoreBase
from bot.memory.core.notes import quotes_missing
from bot.memory.records import (
    MSG_COLS,
    AlreadyStored,
    Conversation,
    EditedMessage,
    StoredMessage,
    msg_from_row,
)

M_COLS = ", ".join(f"m.{c.strip()}" for c in MSG_COLS.split(","))
_NEW_COLS = (
    "conversation_id, role, author, text, created_at, tokens, platform_id,"
    " reply_to_platform_id, parent_id, status, origin_conversation_id"
)
# The message a reply answers: the newest with that platform id in the conversation, else the
# answer one of whose later parts (outbox_parts) the platform id names. Params: conversation,
# platform id, platform id, conversation.
_PARENT_SQL = (
    "coalesce((SELECT id FROM messages WHERE conversation_id = ? AND platform_id = ? "
    "ORDER BY id DESC LIMIT 1), (SELECT m.id FROM outbox_parts p "
    "JOIN outbox o ON o.id = p.outbox_id JOIN messages m ON m.id = o.answer_id "
    "WHERE p.platform_id = ? AND m.conversation_id = ? ORDER BY m.id DESC LIMIT 1))"
)


class MessagesMixin(CoreBase):
    # --- conversations ----------------------------------------------------------------------
    async def conversation(self, key: ConversationKey) -> Conversation:
        """Get or create the conversation for ``key`` (a linked DM resolves to the joined one)."""
        found = await self.find_conversation(key)
        if found is not None:
            return found
        await self._exec(  # gateways may race to create it: the unique key wins
            "INSERT INTO conversations (transport, person, space, created_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (transport, person, space) DO NOTHING",
            (key.transport, key.person, key.space, time.time()),
        )
        found = await self.find_conversation(key)
        assert found is not None
        return found

    async def find_conversation(self, key: ConversationKey) -> Conversation | None:
        row = await self._one(
            "SELECT c.id, c.reset_after, h.id, h.transport, h.person, h.space, h.reset_after, "
            "coalesce(h.incognito, c.incognito) "
            "FROM conversations c LEFT JOIN conversations h ON h.id = c.merged_into "
            "WHERE c.transport = ? AND c.person = ? AND c.space = ?",
            (key.transport, key.person, key.space),
        )
        if row is None:
            return None
        if row[2] is not None:  # linked: memory lives in the other transport's DM
            home = ConversationKey(row[3], row[4], row[5])
            return Conversation(
                id=row[2], key=home, reset_after=row[6], origin_id=row[0], incognito=bool(row[7])
            )
        return Conversation(id=row[0], key=key, reset_after=row[1], incognito=bool(row[7]))

    async def conversations_of(self, transport: str, person: str) -> list[Conversation]:
        rows = await self._all(
            "SELECT id, space, reset_after FROM conversations "
            "WHERE transport = ? AND person = ? ORDER BY id",
            (transport, person),
        )
        return [Conversation(r[0], ConversationKey(transport, person, r[1]), r[2]) for r in rows]

    async def reset(self, conversation_id: int, *, done: int | None = None) -> int:
        """Start a fresh conversation: everything so far leaves the context. Returns the mark.
        ``done``: the held ``!reset`` this is the effect of, marked done in the same
        transaction."""
        async with self._atomic() as tx:
            # PostgreSQL: the row lock waits for messages being stored in this conversation
            # (their foreign key holds a share lock on it), so the mark covers them.
            await tx.one(
                "SELECT reset_after FROM conversations WHERE id = ?" + self.dialect.for_update,
                (conversation_id,),
            )
            mark = int(
                await tx.val(
                    "SELECT coalesce(max(id), 0) FROM messages WHERE conversation_id = ?",
                    (conversation_id,),
                )
            )
            await tx.exec(
                "UPDATE conversations SET reset_after = ? WHERE id = ? AND reset_after < ?",
                (mark, conversation_id, mark),
            )
            await self._command_done(tx, done)
        return mark

    async def reset_mark(self, conversation_id: int) -> int:
        value = await self._val(
            "SELECT reset_after FROM conversations WHERE id = ?", (conversation_id,)
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
        """Insert one message and return its id. ``answers`` marks that user message answered
        in the same transaction (one commit per stored reply). ``origin_id``
        (``Conversation.origin_id``) records the linked DM it arrived in; if that link was
        undone meanwhile the message goes to its own conversation instead. A user message
        heard before (same platform id within ``HEARD_WINDOW_SECONDS``) raises
        ``AlreadyStored``. ``reply_to_platform_id`` sets the parent when ``parent_id`` is not
        given (the message, or the multi-part answer, with that platform id)."""
        created = time.time() if created_at is None else created_at

        def insert(conversation_id: int, origin_id: int | None) -> tuple[str, tuple[Any, ...]]:
            head, guard = "", ""
            head_args: tuple[Any, ...] = ()
            parent_args: tuple[Any, ...]
            if role == "user" and platform_id is not None:
                head = f"WITH fresh AS ({self.dialect.heard_fresh}) "
                guard = " WHERE EXISTS (SELECT 1 FROM fresh)"
                head_args = (conversation_id, platform_id, created)
            parent, parent_args = "?", (parent_id,)
            if parent_id is None and reply_to_platform_id is not None:
                reply = reply_to_platform_id
                parent, parent_args = _PARENT_SQL, (conversation_id, reply, reply, conversation_id)
            col, value, search_args = self._search_column(conversation_id, author, text, created)
            col, value = (f", {col}", f", {value}") if col else ("", "")
            sql = (
                f"{head}INSERT INTO messages ({_NEW_COLS}{col}) SELECT ?, ?, ?, ?, ?, ?, ?, ?,"
                f" {parent}, ?, ?{value}{guard} RETURNING id"
            )
            args = (
                *head_args, conversation_id, role, author, text, created, tokens, platform_id,
                reply_to_platform_id, *parent_args, status, origin_id, *search_args,
            )  # fmt: skip
            return sql, args

        if origin_id is None and answers is None:  # one statement: its own transaction
            new_id = await self._val(*insert(conversation_id, None))
        else:
            async with self._atomic() as tx:
                if origin_id is not None:
                    home = await tx.val(
                        "SELECT merged_into FROM conversations WHERE id = ?", (origin_id,)
                    )
                    if home != conversation_id:  # !unlink during the turn
                        conversation_id, origin_id = origin_id, None
                new_id = await tx.val(*insert(conversation_id, origin_id))
                if new_id is not None and answers is not None:
                    await tx.exec(
                        "UPDATE messages SET status = 'answered' WHERE id = ?", (answers,)
                    )
        if new_id is None:
            assert platform_id is not None
            raise AlreadyStored(conversation_id, platform_id)
        return int(new_id)

    async def add_messages(
        self, conversation_id: int, rows: Sequence[tuple[str, str, str, int, float]]
    ) -> None:
        """Bulk insert (role, author, text, tokens, created_at) in one transaction."""
        cols = ("conversation_id", "role", "author", "text", "tokens", "created_at", "status")
        sql, args = self._insert_rows(
            "messages", cols, [(conversation_id, *r, "imported") for r in rows]
        )
        async with self._atomic() as tx:
            await tx.many(sql, args)

    async def pending_messages(
        self, *, since: float, transports: Sequence[str], stale_before: float | None = None
    ) -> list[tuple[ConversationKey, StoredMessage]]:
        """User messages stored but never answered (crash, shutdown), oldest first: every one
        of them (each gets its own answer). With ``stale_before``: only those stored before it
        whose claim is empty or older than it (their gateway died: bot.memory.keep)."""
        if not transports:
            return []
        among, among_args = self.dialect.in_texts("c.transport", transports)
        stale = ""
        stale_args: tuple[float, ...] = ()
        if stale_before is not None:
            stale = "AND m.created_at < ? AND (m.claimed_by IS NULL OR m.claimed_at < ?) "
            stale_args = (stale_before, stale_before)
        rows = await self._all(
            f"SELECT c.transport, c.person, c.space, {M_COLS} FROM messages m "
            # a message sent through a linked DM is answered on the transport it came from
            "JOIN conversations c ON c.id = coalesce(m.origin_conversation_id, m.conversation_id) "
            f"WHERE m.status = 'pending' AND m.role = 'user' AND m.created_at >= ? "
            f"AND {among} AND m.id > c.reset_after {stale}ORDER BY m.id",
            (since, *among_args, *stale_args),
        )
        return [(ConversationKey(r[0], r[1], r[2]), msg_from_row(tuple(r)[3:])) for r in rows]

    async def known_platform_ids(
        self, transport: str, platform_ids: Sequence[str], *, since: float
    ) -> set[str]:
        """Which of ``platform_ids`` are stored for ``transport`` in messages created at or
        after ``since`` (the window bounds the scan: created_at is indexed), or were heard as
        commands (held, or released and kept as tombstones: a command read back from
        history after a restart is never run a second time; a held one is run by recovery)."""
        if not platform_ids:
            return set()
        among, among_args = self.dialect.in_texts("m.platform_id", platform_ids)
        held, held_args = self.dialect.in_texts("platform_id", platform_ids)
        rows = await self._all(
            "SELECT m.platform_id FROM messages m JOIN conversations c "
            "ON c.id = m.conversation_id WHERE m.created_at >= ? AND c.transport = ? "
            f"AND {among} UNION SELECT platform_id FROM held_commands "
            f"WHERE transport = ? AND {held}",
            (since, transport, *among_args, transport, *held_args),
        )
        return {str(r[0]) for r in rows}

    async def mark_answered(self, conversation_id: int, ids: Sequence[int]) -> int:
        """Mark still-pending user messages of the conversation answered (a turn folded them
        into its prompt and answered them with its own question)."""
        if not ids:
            return 0
        among, among_args = self.dialect.in_ids("id", ids)
        return await self._exec(  # lost in a server crash: a later question covers them
            "UPDATE messages SET status = 'answered' WHERE conversation_id = ? AND role = "
            f"'user' AND status = 'pending' AND {among}",
            (conversation_id, *among_args),
            durable=False,
        )

    async def claim_question(self, message_id: int, *, stale_before: float) -> bool:
        """Compare-and-set: take a pending question for this gateway unless another gateway's
        claim is newer than ``stale_before`` (bot.memory.keep: its gateway may still be at
        work). Two gateways racing for it: one UPDATE with its condition, so one wins. On
        SQLite one process owns the file, so the holder is always this one."""
        holder = self._claim_gateway()
        took = await self._exec(
            "UPDATE messages SET claimed_by = ?, claimed_at = ? WHERE id = ? AND "
            "status = 'pending' AND (claimed_by IS NULL OR claimed_by = ? OR claimed_at < ?)",
            (holder, time.time(), message_id, holder, stale_before),
            durable=False,  # visible at once; lost only with the server, then claimed again
        )
        return took == 1

    async def set_status(
        self, message_id: int, status: str, *, platform_id: str | None = None
    ) -> None:
        await self._exec(
            "UPDATE messages SET status = ?, platform_id = coalesce(?, platform_id) WHERE id = ?",
            (status, platform_id, message_id),
        )

    # --- reads ------------------------------------------------------------------------------
    async def recent_messages(
        self, conversation: Conversation, *, limit: int, before_id: int | None = None
    ) -> list[StoredMessage]:
        """Newest first, after the reset mark, at most ``limit``. With ``before_id`` (the
        message being answered): the conversation as it stands for that message, i.e. the
        messages before it plus the answers to them, even when an answer was stored after it
        (a second question sent before the first was answered)."""
        before = before_id or MAX_ID
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
            (conversation_id, after_id, min(up_to_id, MAX_ID)),
        )
        return [msg_from_row(r) for r in rows]

    async def messages_with_notes(
        self, conversation_id: int, *, after_id: int, up_to_id: int
    ) -> tuple[list[StoredMessage], dict[int, str]]:
        """``messages_between`` and, from the same read, what ``recall_notes`` gives for its
        user messages (a note quoting a message that is gone is left out)."""
        rows = await self._all(
            f"SELECT {MSG_COLS}, CASE WHEN role = 'user' AND recall_note IS NOT NULL "
            f"AND NOT {quotes_missing(self.dialect)} THEN recall_note END FROM messages "
            "WHERE conversation_id = ? AND id > ? AND id <= ? ORDER BY id",
            (conversation_id, after_id, min(up_to_id, MAX_ID)),
        )
        notes = {int(r[0]): str(r[-1]) for r in rows if r[-1] is not None}
        return [msg_from_row(tuple(r)[:-1]) for r in rows], notes

    async def message_by_platform_id(self, conversation_id: int, platform_id: str) -> int | None:
        value = await self._val(
            "SELECT id FROM messages WHERE conversation_id = ? AND platform_id = ? "
            "ORDER BY id DESC LIMIT 1",
            (conversation_id, platform_id),
        )
        return None if value is None else int(value)

    async def edit_message(
        self,
        conversation_id: int,
        platform_id: str,
        *,
        text: str,
        tokens: int,
        reopen: bool = False,
        withdrawn: str = "",
    ) -> EditedMessage | None:
        """The person edited the user message stored under ``platform_id`` (None: no such
        message). Its text and search words become the new ones in one transaction and its
        vectors are dropped (re-embedded by the indexer): the old words are no longer found.
        ``reopen`` (the newest user message, already answered): it is ``pending`` again and
        each of its answers' text becomes ``withdrawn`` (their search words too), so the
        old answer, which may repeat what was edited out, leaves the prompt as well."""
        async with self._atomic() as tx:
            row = await tx.one(
                f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = ? AND platform_id = ?"
                " AND role = 'user' ORDER BY id DESC LIMIT 1",
                (conversation_id, platform_id),
            )
            if row is None:
                return None
            old = msg_from_row(row)
            newest = await tx.val(
                "SELECT max(id) FROM messages WHERE conversation_id = ? AND role = 'user'",
                (conversation_id,),
            )
            await self._rewrite(tx, old, text, tokens)
            reopened = False
            changed = old.text.strip() != text.strip()
            if reopen and changed and old.status == "answered" and newest == old.id:
                answers = await tx.all(
                    f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = ? AND "
                    "parent_id = ? AND role = 'assistant'",
                    (conversation_id, old.id),
                )
                for answer in answers:
                    await self._rewrite(tx, msg_from_row(answer), withdrawn, 8)
                await tx.exec(
                    "UPDATE messages SET status = 'pending', claimed_by = NULL WHERE id = ?",
                    (old.id,),
                )
                reopened = True
        edited = StoredMessage(
            old.id, old.conversation_id, old.role, old.author, text, old.created_at, tokens,
            old.platform_id, old.parent_id, "pending" if reopened else old.status,
        )  # fmt: skip
        return EditedMessage(message=edited, old_status=old.status, reopened=reopened)

    async def _rewrite(self, tx: Any, msg: StoredMessage, text: str, tokens: int) -> None:
        col, value, args = self._search_column(msg.conversation_id, msg.author, text,
                                               msg.created_at)  # fmt: skip
        search = f", {col} = {value}" if col else ""
        await tx.exec(
            f"UPDATE messages SET text = ?, tokens = ?{search} WHERE id = ?",
            (text, tokens, *args, msg.id),
        )
        await tx.exec("DELETE FROM message_vectors WHERE message_id = ?", (msg.id,))

    async def messages_by_ids(self, ids: Sequence[int]) -> list[StoredMessage]:
        if not ids:
            return []
        among, among_args = self.dialect.in_ids("id", ids)
        rows = await self._all(
            f"SELECT {MSG_COLS} FROM messages WHERE {among} ORDER BY id", among_args
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
            f" SELECT {M_COLS} FROM chain c JOIN messages m ON m.id = c.id ORDER BY c.depth",
            (message_id, limit),
        )
        return [msg_from_row(r) for r in rows]

    async def all_messages(self, conversation_id: int) -> list[StoredMessage]:
        return await self.messages_between(conversation_id, after_id=0, up_to_id=MAX_ID)

    async def count_messages(self, conversation_id: int, *, since_reset: bool = False) -> int:
        since = " AND m.id > c.reset_after" if since_reset else ""
        value = await self._val(
            "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE m.conversation_id = ?{since}",
            (conversation_id,),
        )
        return int(value or 0)

    async def count_person_messages(
        self, transport: str, person: str, *, space: str | None = None
    ) -> int:
        """Messages the person sent on ``transport``: in every space, or in ``space`` only."""
        where, args = "", [transport, person]
        if space is not None:
            where, args = " AND c.space = ?", [transport, person, space]
        value = await self._val(
            "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE c.transport = ? AND c.person = ? AND m.role = 'user'{where}",
            args,
        )
        return int(value or 0)
