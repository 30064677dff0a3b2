"""The durable outbox: answers and notices that must still reach someone, with progress
(both backends).

Invariants:
- ``queue_delivery`` writes the outbox row, the assistant turn (when it carries an answer) and
  the question's new status in one transaction: after a crash either all of them exist (the
  answer is delivered from the outbox at the next start) or none (the question is still
  ``pending`` and is answered again). An answer asked through a linked DM records the DM it
  came from, or goes to its own conversation if the link was undone during the turn.
- A part's platform id is recorded as soon as the platform accepted it (``record_part``); a
  part with a recorded id is never sent again.
- ``finish_delivery`` ends a row (delivered, sent, failed, expired) and gives the assistant
  message the same status; finished rows are never listed by ``undelivered`` again. It is
  written ``durable=False`` (``bot.memory.core.db``): the parts it follows were recorded
  durably, so a finish lost with a crashed database server costs a round that sends nothing.
- ``take_more`` hands out the rest of a cut answer once (on PostgreSQL the row is locked
  while taken).
- On PostgreSQL each row records the gateway that queued it (``Dialect.outbox_gateway``): the
  one whose transport holds the link to that person. ``undelivered`` lists only this
  gateway's rows, so another gateway never sends them; a gateway restarted under the same
  name picks its rows up again. SQLite has one gateway.
- Claims and planned packet ids: see ``bot.memory.outbox_claims``. A claim is one UPDATE with
  its condition (``pending`` and unclaimed): of two claimers, one wins. At start a gateway
  releases the claims its own dead processes left (owner token prefix); on SQLite, one
  process owns the file, so every claim not held by this store is stale when it opens.
- Shown parts (``record_shown``): the messages a streamed answer put on screen, recorded by
  question as they are posted (its outbox row does not exist yet), so that after a restart the
  answer edits them instead of posting a second copy. ``OutboxRow.shown`` carries them for a
  row's question; ``finish_delivery`` clears them (the row's own parts are recorded).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bot.domain import ConversationKey
from bot.memory.core.db import CoreBase, Tx
from bot.memory.outbox_claims import new_owner, owner_prefix
from bot.memory.records import (
    OUTBOX_KINDS,
    OUTBOX_STATES,
    HeldCommand,
    OutboxEntry,
    OutboxRow,
    StoredAnswer,
)

_COLS = (
    "id, transport, person, space, kind, text, reply_to, question_id, rest, state, created_at,"
    " answer_id"
)
# A row's progress in one read: its recorded parts (0), planned packet ids (1) and the parts
# its question's stream showed (2), each by part.
_PROGRESS = (
    "SELECT 0, part, platform_id FROM outbox_parts WHERE outbox_id = ? UNION ALL "
    "SELECT 1, part, CAST(packet_id AS TEXT) FROM outbox_packets WHERE outbox_id = ? UNION ALL "
    "SELECT 2, part, platform_id FROM shown_parts WHERE question_id = ? ORDER BY 1, 2"
)
_SHOWN = "SELECT part, platform_id FROM shown_parts WHERE question_id = ? ORDER BY part"
_ANSWER_COLS = (
    "conversation_id", "role", "author", "text", "created_at", "tokens", "parent_id", "status",
    "origin_conversation_id",
)  # fmt: skip


# A held command answered: never run again; kept as a tombstone (021) that names no one and
# holds none of its words: the platform's message id, for catch-up, and when.
RELEASE = (
    "UPDATE held_commands SET released_at = ?, text = '', author = NULL, person = '', "
    "space = '' WHERE id = ?"
)


class OutboxMixin(CoreBase):
    _owner: str | None = None

    @property
    def claim_owner(self) -> str:
        """This store's claim owner token (``bot.memory.outbox_claims``)."""
        if self._owner is None:
            self._owner = new_owner(self._claim_gateway())
        return self._owner

    async def queue_delivery(
        self,
        entry: OutboxEntry,
        *,
        answer: StoredAnswer | None = None,
        question_status: str | None = None,
        claim: bool = False,
    ) -> int:
        """Add an outbox row (state ``pending``) and return its id. With ``answer``, the
        assistant message (status ``sending``, parent: the question) is stored and the question
        marked ``answered`` in the same transaction; else ``question_status`` (e.g. ``failed``)
        is set on ``entry.question_id`` in that transaction. ``claim``: the row is created
        claimed by this process (``undelivered`` never lists it while the claim holds).
        On PostgreSQL the common case (no linked DM) is one statement: one round trip."""
        return (await self._queued(entry, answer, question_status, claim)).id

    async def queue_claimed(
        self,
        entry: OutboxEntry,
        *,
        answer: StoredAnswer | None = None,
        question_status: str | None = None,
        release: int | None = None,
    ) -> OutboxRow:
        """``queue_delivery(..., claim=True)``, returning the new row as ``outbox_row`` would
        read it (no parts yet; the parts its question's stream showed), from the same
        statement (PostgreSQL) or transaction (SQLite): no second read. ``release``: the held
        command this row answers, released in the same write (``release_command``), so a
        kill can never leave a queued reply with its command still held (run twice)."""
        return await self._queued(entry, answer, question_status, True, release)

    async def _queued(
        self,
        entry: OutboxEntry,
        answer: StoredAnswer | None,
        question_status: str | None,
        claim: bool,
        release: int | None = None,
    ) -> OutboxRow:
        if entry.kind not in OUTBOX_KINDS:
            raise ValueError(f"unknown outbox kind {entry.kind!r}")
        now = time.time()
        if answer is not None and answer.origin_id is not None:
            async with self._atomic() as tx:  # asked through a linked DM: is the link still there?
                home = await tx.val(
                    "SELECT merged_into FROM conversations WHERE id = ?", (answer.origin_id,)
                )
                if home != answer.conversation_id:  # !unlink during the turn
                    answer = replace(answer, conversation_id=answer.origin_id, origin_id=None)
                return await self._queue(tx, entry, answer, question_status, claim, now, release)
        if self.dialect.name == "postgres":  # one statement: the writes as WITH parts
            return await self._queue(None, entry, answer, question_status, claim, now, release)
        async with self._atomic() as tx:
            return await self._queue(tx, entry, answer, question_status, claim, now, release)

    async def _queue(
        self,
        tx: Tx | None,
        entry: OutboxEntry,
        answer: StoredAnswer | None,
        question_status: str | None,
        claim: bool,
        now: float,
        release: int | None = None,
    ) -> OutboxRow:
        """``queue_delivery``'s writes: in ``tx`` one statement after the other, or (``tx``
        None, PostgreSQL) as one statement whose outbox row takes the answer's id from the
        ``WITH`` part that inserted it and whose result rows carry the question's shown
        parts (one per part, or one row of NULLs)."""
        steps: list[tuple[str, tuple[Any, ...]]] = []
        answer_id: Any = None
        if answer is not None:
            written = now if answer.created_at is None else answer.created_at
            row = (answer.conversation_id, "assistant", answer.author, answer.text, written,
                   answer.tokens, entry.question_id, "sending", answer.origin_id)  # fmt: skip
            sql, args = self._insert_rows("messages", _ANSWER_COLS, [row])
            steps.append((sql + " RETURNING id", args[0]))
            question_status = "answered"
        if question_status is not None and entry.question_id is not None:
            update = "UPDATE messages SET status = ? WHERE id = ?"
            steps.append((update, (question_status, entry.question_id)))
        if release is not None:
            steps.append((RELEASE, (now, release)))
        if tx is not None:  # one statement after the other; the answer's id for the row
            if answer is not None:
                answer_id = int(await tx.val(*steps[0]))
            for sql, more in steps[1 if answer is not None else 0 :]:
                await tx.exec(sql, more)
        k = entry.key
        cols = (
            "transport, person, space, kind, text, reply_to, question_id, answer_id, rest,"
            " created_at, updated_at, claimed_by, claimed_at"
        )
        values: tuple[Any, ...] = (
            k.transport, k.person, k.space, entry.kind, entry.text, entry.reply_to,
            entry.question_id, answer_id, entry.rest, now, now,
            self.claim_owner if claim else None, now if claim else None,
        )  # fmt: skip
        if self.dialect.outbox_gateway:
            cols += ", gateway"
            values += (self._claim_gateway(),)
        marks = ["?"] * len(values)
        if tx is None and answer is not None:
            marks[7] = "(SELECT id FROM s0)"  # the answer inserted by the first WITH part
            values = values[:7] + values[8:]
        insert = f"INSERT INTO outbox ({cols}) VALUES ({', '.join(marks)}) RETURNING id"
        # (the statement form below returns answer_id too: ``{insert}, answer_id``)
        if tx is not None:
            new_id = int(await tx.val(insert, values))
            shown = [tuple(r) for r in await tx.all(_SHOWN, (entry.question_id,))]
        else:
            parts = "".join(f"s{i} AS ({sql}), " for i, (sql, _) in enumerate(steps))
            first = [p for _, args in steps for p in args]
            rows = await self._all(
                f"WITH {parts}q AS ({insert}, answer_id) SELECT q.id, q.answer_id, sp.part,"
                " sp.platform_id FROM q LEFT JOIN shown_parts sp ON sp.question_id = ?"
                " ORDER BY sp.part",
                [*first, *values, entry.question_id],
            )
            new_id, answer_id = int(rows[0][0]), rows[0][1]
            shown = [(r[2], r[3]) for r in rows if r[2] is not None]
        return OutboxRow(
            id=new_id,
            entry=entry,
            state="pending",
            parts=(),
            created_at=now,
            answer_id=answer_id,
            shown=tuple((int(p), str(v)) for p, v in shown),
        )

    def _part_insert(self, table: str, key: str, value: str, parent: str, *, keep: bool) -> str:
        """INSERT of (``key``, part, ``value``) into ``table`` (``?`` for the three, then the
        parent's id), only while the parent row exists (``!forget`` may have deleted it; on
        PostgreSQL ``key_share`` keeps it until the commit). ``keep``: the first value stored
        for a part stays; otherwise a later one replaces it."""
        action = "NOTHING" if keep else f"UPDATE SET {value} = excluded.{value}"
        return (
            f"INSERT INTO {table} ({key}, part, {value}) SELECT ?, ?, ? "
            f"WHERE EXISTS (SELECT 1 FROM {parent} WHERE id = ?{self.dialect.key_share}) "
            f"ON CONFLICT ({key}, part) DO {action}"
        )

    async def record_part(self, outbox_id: int, part: int, platform_id: str) -> None:
        """Part ``part`` (0-based) of the row went out with ``platform_id``. A row deleted
        meanwhile (``!forget``) is left alone."""
        # One transaction, not ``_together``: on PostgreSQL the guard's FOR KEY SHARE would
        # not see the outbox row the same statement's UPDATE changed (and insert nothing).
        async with self._atomic() as tx:
            await tx.exec(
                self._part_insert("outbox_parts", "outbox_id", "platform_id", "outbox", keep=False),
                (outbox_id, part, platform_id, outbox_id),
            )
            await tx.exec("UPDATE outbox SET updated_at = ? WHERE id = ?", (time.time(), outbox_id))

    async def claim_delivery(self, outbox_id: int) -> OutboxRow | None:
        """Claim a ``pending``, unclaimed row for this process (compare-and-set) and return it
        as it stands now; None when it is claimed (by any gateway), finished or gone."""
        won = await self._exec(
            "UPDATE outbox SET claimed_by = ?, claimed_at = ? WHERE id = ? AND"
            " state = 'pending' AND claimed_by IS NULL",
            (self.claim_owner, time.time(), outbox_id),
        )
        return await self.outbox_row(outbox_id) if won == 1 else None

    async def release_delivery(self, outbox_id: int) -> None:
        """Give back this process's claim on a row that stays ``pending`` (it waits for its
        link); the next outbox round may claim it again."""
        await self._exec(
            "UPDATE outbox SET claimed_by = NULL, claimed_at = NULL WHERE id = ? AND"
            " claimed_by = ?",
            (outbox_id, self.claim_owner),
        )

    async def release_stale_claims(self) -> int:
        """At start: release claims a dead process of this gateway left on ``pending`` rows
        (other gateways' claims are theirs)."""
        prefix = owner_prefix(self._claim_gateway())
        n = await self._exec(
            "UPDATE outbox SET claimed_by = NULL, claimed_at = NULL WHERE state = 'pending'"
            " AND claimed_by IS NOT NULL AND claimed_by != ?"
            " AND substr(claimed_by, 1, length(?)) = ?",
            (self.claim_owner, prefix, prefix),
        )
        return max(0, n)

    async def plan_part(self, outbox_id: int, part: int, packet_id: int) -> int:
        """Store the packet id chosen for a part before it is written; the first id stored for
        the part wins and is returned (0 when the row is gone: ``!forget``)."""
        async with self._atomic() as tx:
            await tx.exec(
                self._part_insert("outbox_packets", "outbox_id", "packet_id", "outbox", keep=True),
                (outbox_id, part, packet_id, outbox_id),
            )
            got = await tx.val(
                "SELECT packet_id FROM outbox_packets WHERE outbox_id = ? AND part = ?",
                (outbox_id, part),
            )
        return int(got) if got is not None else 0

    async def record_shown(self, question_id: int, part: int, platform_id: str | None) -> None:
        """A streamed answer to ``question_id`` shows part ``part`` as message ``platform_id``
        (None: that message was deleted). A question deleted meanwhile is left alone."""
        if platform_id is None:
            await self._exec(
                "DELETE FROM shown_parts WHERE question_id = ? AND part = ?", (question_id, part)
            )
            return
        await self._exec(
            self._part_insert("shown_parts", "question_id", "platform_id", "messages", keep=False),
            (question_id, part, platform_id, question_id),
        )

    async def shown_parts(self, question_id: int) -> tuple[tuple[int, str], ...]:
        """(part, platform id) of the messages a stream of this question's answer left on
        screen, by part."""
        rows = await self._all(_SHOWN, (question_id,))
        return tuple((int(r[0]), str(r[1])) for r in rows)

    async def finish_delivery(
        self, outbox_id: int, state: str, *, detail: str | None = None
    ) -> None:
        """End the row in ``state`` (not ``pending``); the answer message follows."""
        if state not in OUTBOX_STATES or state == "pending":
            raise ValueError(f"not a final outbox state: {state!r}")
        await self._together([
            ("UPDATE outbox SET state = ?, detail = ?, updated_at = ? WHERE id = ?",
             (state, detail, time.time(), outbox_id)),
            ("UPDATE messages SET status = ?, platform_id = coalesce(platform_id,"
             " (SELECT platform_id FROM outbox_parts WHERE outbox_id = ? ORDER BY part"
             " LIMIT 1)) WHERE id = (SELECT answer_id FROM outbox WHERE id = ?)",
             (state, outbox_id, outbox_id)),
            ("DELETE FROM shown_parts WHERE question_id ="
             " (SELECT question_id FROM outbox WHERE id = ?)", (outbox_id,)),
        ], durable=False)  # fmt: skip

    async def undelivered(self, *, transports: Sequence[str]) -> list[OutboxRow]:
        """Unclaimed rows still ``pending`` on these transports (this gateway's), oldest
        first, with their progress."""
        if not transports:
            return []
        where, params = self.dialect.in_texts("transport", transports)
        if self.dialect.outbox_gateway:
            where += " AND gateway = ?"
            params += (self._claim_gateway(),)
        rows = await self._all(
            f"SELECT {_COLS} FROM outbox WHERE state = 'pending' AND claimed_by IS NULL "
            f"AND {where} ORDER BY id",
            params,
        )
        return [await self._outbox_row(r) for r in rows]

    async def waiting_replies(self) -> dict[str, int]:
        """Rows still ``pending`` per transport (this gateway's): what the status reports as
        waiting in the outbox."""
        where = "state = 'pending'"
        params: tuple[str, ...] = ()
        if self.dialect.outbox_gateway:
            where, params = where + " AND gateway = ?", (self._claim_gateway(),)
        rows = await self._all(
            f"SELECT transport, count(*) FROM outbox WHERE {where} GROUP BY transport", params
        )
        return {str(r[0]): int(r[1]) for r in rows}

    @property
    def outbox_gateway(self) -> str | None:
        """The gateway whose rows this store lists (PostgreSQL), None on a one-gateway store."""
        return self._claim_gateway() if self.dialect.outbox_gateway else None

    async def outbox_by_state(self) -> dict[str, tuple[int, float]]:
        """Rows by state (this gateway's): how many, and the oldest's ``created_at``. Finished
        rows are pruned by age (``bot.memory.keep``), so the table stays small."""
        gateway = self.outbox_gateway
        where, params = ("WHERE gateway = ?", (gateway,)) if gateway is not None else ("", ())
        rows = await self._all(
            f"SELECT state, count(*), min(created_at) FROM outbox {where} GROUP BY state", params
        )
        return {str(r[0]): (int(r[1]), float(r[2])) for r in rows}

    async def outbox_gateways(self, *, since: float) -> list[tuple[str, float]]:
        """Other gateways that wrote a row after ``since``, by name, with their newest
        ``updated_at`` (none on a one-gateway store)."""
        gateway = self.outbox_gateway
        if gateway is None:
            return []
        rows = await self._all(
            "SELECT gateway, max(updated_at) FROM outbox WHERE gateway <> ? AND updated_at > ? "
            "GROUP BY gateway ORDER BY gateway",
            (gateway, since),
        )
        return [(str(r[0]), float(r[1])) for r in rows if r[0]]

    async def outbox_row(self, outbox_id: int) -> OutboxRow | None:
        row = await self._one(f"SELECT {_COLS} FROM outbox WHERE id = ?", (outbox_id,))
        return None if row is None else await self._outbox_row(row)

    async def take_more(self, key: ConversationKey) -> str | None:
        """The rest of the newest cut answer in ``key`` (once), or None."""
        async with self._atomic() as tx:
            row = await tx.one(
                "SELECT id, rest FROM outbox WHERE transport = ? AND person = ? AND space = ? "
                "AND kind IN ('answer', 'more') ORDER BY id DESC LIMIT 1" + self.dialect.for_update,
                (key.transport, key.person, key.space),
            )
            if row is None or not row[1]:
                return None
            await tx.exec("UPDATE outbox SET rest = NULL WHERE id = ?", (row[0],))
            return str(row[1])

    async def _outbox_row(self, r: Any) -> OutboxRow:
        found: dict[int, list[tuple[int, str]]] = {0: [], 1: [], 2: []}
        for kind, part, value in await self._all(_PROGRESS, (r[0], r[0], r[7])):
            found[int(kind)].append((int(part), str(value)))
        entry = OutboxEntry(
            key=ConversationKey(r[1], r[2], r[3]),
            kind=r[4],
            text=r[5],
            reply_to=r[6],
            question_id=r[7],
            rest=r[8],
        )
        return OutboxRow(
            id=r[0],
            entry=entry,
            state=r[9],
            parts=tuple(found[0]),
            created_at=float(r[10]),
            answer_id=r[11],
            packet_ids=tuple((p, int(v)) for p, v in found[1]),
            shown=tuple(found[2]),
        )

    # --- commands held until answered (bot.responder) ---------------------------------------
    async def hold_command(
        self,
        key: ConversationKey,
        text: str,
        *,
        platform_id: str | None,
        author: str | None,
        authenticated: bool = False,
    ) -> int:
        """Store a command before it runs (``release_command`` once its reply is queued)."""
        return int(
            await self._val(
                "INSERT INTO held_commands (gateway, transport, person, space, text, "
                "platform_id, author, created_at, authenticated) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (
                    self._claim_gateway(),
                    key.transport,
                    key.person,
                    key.space,
                    text,
                    platform_id,
                    author,
                    time.time(),
                    int(authenticated),
                ),
            )
        )

    async def release_command(self, command_id: int) -> None:
        """The command's reply is queued (or it failed and its person was told): it is never
        run again; the row stays as a tombstone for catch-up with neither its text nor its
        person (migration 021, pruned by ``prune_outbox``)."""
        await self._exec(RELEASE, (time.time(), command_id))

    async def held_commands(self, *, transports: Sequence[str]) -> list[HeldCommand]:
        """This gateway's commands stored and never answered (a kill), oldest first."""
        if not transports:
            return []
        among, among_args = self.dialect.in_texts("transport", transports)
        rows = await self._all(
            "SELECT id, transport, person, space, text, platform_id, author, created_at, "
            "done_at, authenticated FROM held_commands "
            f"WHERE gateway = ? AND released_at IS NULL AND {among} ORDER BY id",
            (self._claim_gateway(), *among_args),
        )
        return [
            HeldCommand(
                int(r[0]),
                ConversationKey(r[1], r[2], r[3]),
                r[4],
                r[5],
                r[6],
                float(r[7]),
                done=r[8] is not None,
                authenticated=bool(r[9]),
            )
            for r in rows
        ]
