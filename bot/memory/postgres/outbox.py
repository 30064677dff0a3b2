"""The durable outbox on PostgreSQL: answers and notices that must still reach someone.

Invariants (as ``bot.memory.sqlite.outbox``), plus one for several gateways:
- ``queue_delivery`` writes the outbox row, the assistant turn (when it carries an answer) and
  the question's new status in one transaction.
- A part's platform id is recorded as soon as the platform accepted it; it is never re-sent.
- ``finish_delivery`` ends a row and gives the assistant message the same status.
- ``take_more`` hands out the rest of a cut answer once (the row is locked while taken).
- Each row records the gateway that queued it (``PgBase.gateway``): the one whose transport
  holds the link to that person (the radio that heard them, the Discord session that got the
  DM). ``undelivered`` lists only this gateway's rows, so another gateway never sends them;
  a gateway restarted under the same name picks its rows up again.
- Claims and planned packet ids: see ``bot.memory.outbox_claims``. A claim is one UPDATE with
  its condition (``pending`` and unclaimed): of two gateways claiming a row, one wins. At start
  a gateway releases the claims its own dead processes left (owner token prefix).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bot.domain import ConversationKey
from bot.memory.outbox_claims import new_owner, owner_prefix
from bot.memory.postgres.base import PgBase
from bot.memory.postgres.messages import SEARCH_SQL
from bot.memory.postgres.words import fold, meta
from bot.memory.records import (
    OUTBOX_KINDS,
    OUTBOX_STATES,
    OutboxEntry,
    OutboxRow,
    StoredAnswer,
)

_COLS = (
    "id, transport, person, space, kind, text, reply_to, question_id, rest, state, created_at,"
    " answer_id"
)


class OutboxMixin(PgBase):
    _owner: str | None = None

    @property
    def claim_owner(self) -> str:
        """This store's claim owner token (``bot.memory.outbox_claims``)."""
        if self._owner is None:
            self._owner = new_owner(self.gateway)
        return self._owner

    async def queue_delivery(
        self,
        entry: OutboxEntry,
        *,
        answer: StoredAnswer | None = None,
        question_status: str | None = None,
        claim: bool = False,
    ) -> int:
        """Add an outbox row (state ``pending``) and return its id; see the SQLite twin."""
        if entry.kind not in OUTBOX_KINDS:
            raise ValueError(f"unknown outbox kind {entry.kind!r}")
        now = time.time()
        async with self._tx() as con:
            answer_id: int | None = None
            if answer is not None:
                answer_id = await con.fetchval(
                    "INSERT INTO messages (conversation_id, role, author, text, created_at,"
                    " tokens, parent_id, status, search) VALUES ($1, 'assistant', $2, $3, $4, $5,"
                    f" $6, 'sending', {SEARCH_SQL.format(c=1, a=7, b=8)}) RETURNING id",
                    answer.conversation_id,
                    answer.author,
                    answer.text,
                    now,
                    answer.tokens,
                    entry.question_id,
                    fold(answer.text),
                    fold(meta(answer.author, now)),
                )
                question_status = "answered"
            if question_status is not None and entry.question_id is not None:
                await con.execute(
                    "UPDATE messages SET status = $1 WHERE id = $2",
                    question_status,
                    entry.question_id,
                )
            k = entry.key
            new_id = await con.fetchval(
                "INSERT INTO outbox (transport, person, space, kind, text, reply_to, question_id,"
                " answer_id, rest, created_at, updated_at, gateway, claimed_by, claimed_at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $12, $13)"
                " RETURNING id",
                k.transport,
                k.person,
                k.space,
                entry.kind,
                entry.text,
                entry.reply_to,
                entry.question_id,
                answer_id,
                entry.rest,
                now,
                self.gateway,
                self.claim_owner if claim else None,
                now if claim else None,
            )
            return int(new_id)

    async def record_part(self, outbox_id: int, part: int, platform_id: str) -> None:
        """Part ``part`` (0-based) of the row went out with ``platform_id``. A row deleted
        meanwhile (``!forget``) is left alone."""
        async with self._tx() as con:
            await con.execute(
                "INSERT INTO outbox_parts (outbox_id, part, platform_id) SELECT $1, $2, $3 "
                "WHERE EXISTS (SELECT 1 FROM outbox WHERE id = $1 FOR KEY SHARE) "
                "ON CONFLICT (outbox_id, part) DO UPDATE SET platform_id = EXCLUDED.platform_id",
                outbox_id,
                part,
                platform_id,
            )
            await con.execute(
                "UPDATE outbox SET updated_at = $1 WHERE id = $2", time.time(), outbox_id
            )

    async def claim_delivery(self, outbox_id: int) -> OutboxRow | None:
        """Claim a ``pending``, unclaimed row for this process (compare-and-set) and return it
        as it stands now; None when it is claimed (by any gateway), finished or gone."""
        async with self._tx() as con:
            won = await con.fetchval(
                "UPDATE outbox SET claimed_by = $1, claimed_at = $2 WHERE id = $3 AND"
                " state = 'pending' AND claimed_by IS NULL RETURNING id",
                self.claim_owner,
                time.time(),
                outbox_id,
            )
        return await self.outbox_row(outbox_id) if won is not None else None

    async def release_delivery(self, outbox_id: int) -> None:
        """Give back this process's claim on a row that stays ``pending``."""
        async with self._tx() as con:
            await con.execute(
                "UPDATE outbox SET claimed_by = NULL, claimed_at = NULL WHERE id = $1 AND"
                " claimed_by = $2",
                outbox_id,
                self.claim_owner,
            )

    async def release_stale_claims(self) -> int:
        """At start: release claims a dead process of this gateway left on ``pending`` rows
        (other gateways' claims are theirs)."""
        prefix = owner_prefix(self.gateway)
        async with self._tx() as con:
            rows = await con.fetch(
                "UPDATE outbox SET claimed_by = NULL, claimed_at = NULL WHERE state = 'pending'"
                " AND claimed_by IS NOT NULL AND claimed_by <> $1"
                " AND left(claimed_by, length($2)) = $2 RETURNING id",
                self.claim_owner,
                prefix,
            )
        return len(rows)

    async def plan_part(self, outbox_id: int, part: int, packet_id: int) -> int:
        """Store the packet id chosen for a part before it is written; the first id stored for
        the part wins and is returned (0 when the row is gone)."""
        async with self._tx() as con:
            await con.execute(
                "INSERT INTO outbox_packets (outbox_id, part, packet_id) SELECT $1, $2, $3 "
                "WHERE EXISTS (SELECT 1 FROM outbox WHERE id = $1 FOR KEY SHARE) "
                "ON CONFLICT (outbox_id, part) DO NOTHING",
                outbox_id,
                part,
                packet_id,
            )
            got = await con.fetchval(
                "SELECT packet_id FROM outbox_packets WHERE outbox_id = $1 AND part = $2",
                outbox_id,
                part,
            )
        return int(got) if got is not None else 0

    async def finish_delivery(
        self, outbox_id: int, state: str, *, detail: str | None = None
    ) -> None:
        """End the row in ``state`` (not ``pending``); the answer message follows."""
        if state not in OUTBOX_STATES or state == "pending":
            raise ValueError(f"not a final outbox state: {state!r}")
        async with self._tx() as con:
            await con.execute(
                "UPDATE outbox SET state = $1, detail = $2, updated_at = $3 WHERE id = $4",
                state,
                detail,
                time.time(),
                outbox_id,
            )
            await con.execute(
                "UPDATE messages SET status = $1, platform_id = coalesce(platform_id,"
                " (SELECT platform_id FROM outbox_parts WHERE outbox_id = $2 ORDER BY part"
                " LIMIT 1)) WHERE id = (SELECT answer_id FROM outbox WHERE id = $2)",
                state,
                outbox_id,
            )

    async def undelivered(self, *, transports: Sequence[str]) -> list[OutboxRow]:
        """This gateway's unclaimed rows still ``pending`` on these transports, oldest first."""
        if not transports:
            return []
        rows = await self._all(
            f"SELECT {_COLS} FROM outbox WHERE state = 'pending' AND claimed_by IS NULL "
            "AND transport = ANY($1) AND gateway = $2 ORDER BY id",
            (list(transports), self.gateway),
        )
        return [await self._outbox_row(r) for r in rows]

    async def outbox_row(self, outbox_id: int) -> OutboxRow | None:
        row = await self._one(f"SELECT {_COLS} FROM outbox WHERE id = $1", (outbox_id,))
        return None if row is None else await self._outbox_row(row)

    async def take_more(self, key: ConversationKey) -> str | None:
        """The rest of the newest cut answer in ``key`` (once), or None."""
        async with self._tx() as con:
            row = await con.fetchrow(
                "SELECT id, rest FROM outbox WHERE transport = $1 AND person = $2 AND space = $3 "
                "AND kind IN ('answer', 'more') ORDER BY id DESC LIMIT 1 FOR UPDATE",
                key.transport,
                key.person,
                key.space,
            )
            if row is None or not row[1]:
                return None
            await con.execute("UPDATE outbox SET rest = NULL WHERE id = $1", row[0])
            return str(row[1])

    async def _outbox_row(self, r: Any) -> OutboxRow:
        parts = await self._all(
            "SELECT part, platform_id FROM outbox_parts WHERE outbox_id = $1 ORDER BY part",
            (r[0],),
        )
        planned = await self._all(
            "SELECT part, packet_id FROM outbox_packets WHERE outbox_id = $1 ORDER BY part",
            (r[0],),
        )
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
            parts=tuple((int(p[0]), str(p[1])) for p in parts),
            created_at=float(r[10]),
            answer_id=r[11],
            packet_ids=tuple((int(p[0]), int(p[1])) for p in planned),
        )
