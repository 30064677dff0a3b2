"""``!remember``, ``!facts`` and ``!unremember``: the facts a person pins, from chat.

``bot.commands.Commands`` routes these commands here and fits each reply to the transport;
the replies are plain text.

Invariants:
- ``!remember`` refuses an exact or near duplicate of a pinned fact; a new value for the
  subject of a known fact ("my door code is 7788" after "... is 4521") updates that fact
  (pinned), keeps the old value in its history and says what changed ("door code: 4521 ->
  7788"). At most ``max_facts`` are pinned; a fact over ``FACT_MAX_CHARS`` is refused.
- ``!facts`` lists pinned and extracted facts, numbered, each with its provenance in
  brackets ("you, 3 Nov" for ``!remember``; 'inferred today from "..."' for an extracted
  one) and the value it replaced, if any.
- ``!unremember`` removes the fact with its history, deletes the finished outbox rows that
  quote it, and does not quote it in its reply.
- Each write that is a command's effect carries ``done=`` the held command's id (``held``,
  passed in by ``bot.commands``), so the effect and the command's done mark commit together.
- Only the sender's own conversation is read or changed.
"""

from __future__ import annotations

import time
from typing import Protocol

from bot.domain import Inbound
from bot.llm.tokens import TokenCounter
from bot.memory.fact_values import change_line, same_value
from bot.memory.facts import find_duplicate, find_same_subject, history_note, provenance
from bot.memory.port_derived import Derived
from bot.memory.port_log import ConversationLog
from bot.memory.port_work import Outbox
from bot.memory.records import Conversation, Fact
from bot.text import fit_bytes, small_number


class FactCommandStore(ConversationLog, Derived, Outbox, Protocol):
    """What ``!remember``/``!unremember`` read and change in the store."""


FACT_MAX_CHARS = 300


class FactCommands:
    def __init__(
        self, *, store: FactCommandStore, counter: TokenCounter, prefix: str, max_facts: int
    ) -> None:
        self._store = store
        self._counter = counter
        self.prefix = prefix
        self._max_facts = max_facts

    async def remember(self, inbound: Inbound, arg: str, *, held: int | None = None) -> str:
        fact = " ".join(arg.split())
        if not fact:
            return (
                f"Usage: {self.prefix}remember <fact>, e.g. {self.prefix}remember I am vegetarian"
            )
        if len(fact) > FACT_MAX_CHARS:
            return f"That fact is too long ({len(fact)} chars); keep it under {FACT_MAX_CHARS}."
        conv = await self._store.conversation(inbound.key)
        facts = await self._store.facts(conv.id)
        dup = find_duplicate(fact, facts)
        same = find_same_subject(fact, facts)
        if same is not None and (dup is None or dup.id == same.id):
            return await self._revise(conv, facts, same, fact, held=held)
        if dup is not None and dup.pinned:
            n = facts.index(dup) + 1
            return f"I already have that as fact {n}: {dup.text}"
        pinned = [f for f in facts if f.pinned]
        if len(pinned) >= self._max_facts:
            return (
                f"You have {len(pinned)} pinned facts, the most I keep. Remove one with "
                f"{self.prefix}unremember <n>."
            )
        # Provenance: the latest exchange, which a fact usually refers to; kept from pruning.
        recent = await self._store.recent_messages(conv, limit=2)
        if dup is not None:  # I had inferred it; now the person pins it
            await self._store.remove_fact(conv.id, dup.id)
        await self._store.add_fact(
            conv.id,
            text=fact,
            tokens=self._counter.count(fact),
            source_ids=sorted(m.id for m in recent),
            done=held,  # the effect and the command's done mark: one commit
        )
        n = len(await self._store.facts(conv.id))
        return f"Noted as fact {n} (pinned). I'll keep it in mind in this chat."

    async def _revise(
        self, conv: Conversation, facts: list[Fact], same: Fact, fact: str, *, held: int | None
    ) -> str:
        """``!remember`` of a new value for a known subject: the fact takes it (pinned), the
        old value goes to its history, and the reply says what changed."""
        n = facts.index(same) + 1
        if same.pinned and same_value(fact, same.text):
            return f"I already have that as fact {n}: {same.text}"
        if not same.pinned and sum(f.pinned for f in facts) >= self._max_facts:
            return (
                f"You have {self._max_facts} pinned facts, the most I keep. Remove one with "
                f"{self.prefix}unremember <n>."
            )
        recent = await self._store.recent_messages(conv, limit=2)
        old = await self._store.revise_fact(
            conv.id,
            same.id,
            text=fact,
            tokens=self._counter.count(fact),
            pinned=True,
            source_ids=sorted(m.id for m in recent),
            done=held,
        )
        if old is None:
            return "That fact changed meanwhile. Send it again."
        return (
            f"Updated fact {n}: {change_line(old.text, fact)} (the old value stays in its "
            f"history, {self.prefix}facts)."
        )

    async def facts(self, inbound: Inbound, room: int) -> str:
        conv = await self._store.find_conversation(inbound.key)
        facts = [] if conv is None else await self._store.facts(conv.id)
        if not facts:
            return f"No facts yet. Add one with {self.prefix}remember <fact>."
        each = max(16, (room - 10) // len(facts))
        firsts = {f.id: f.source_ids[0] for f in facts if f.source_ids}
        sources = {m.id: m for m in await self._store.messages_by_ids(sorted(set(firsts.values())))}
        now = time.time()
        items = []
        for i, f in enumerate(facts, 1):  # provenance: when, and from what (bot.memory.facts)
            note = history_note(f, today=now)  # the value it replaced, and whose it was
            why = f" [{provenance(f, sources.get(firsts.get(f.id, -1)), today=now)}"
            why += f"; {note}]" if note else "]"
            why = fit_bytes(why, each - 16) if each >= 28 else ""
            items.append(f"{i}) {fit_bytes(f.text, each - len(why.encode()))}{why}")
        return " ".join(items)

    async def unremember(self, inbound: Inbound, arg: str, *, held: int | None = None) -> str:
        conv = await self._store.find_conversation(inbound.key)
        facts = [] if conv is None else await self._store.facts(conv.id)
        if conv is None or not facts:
            return f"No facts to remove. Add one with {self.prefix}remember <fact>."
        number = small_number(arg)
        if number is None or not 1 <= number <= len(facts):
            return (
                f"Usage: {self.prefix}unremember <n>, n from 1 to {len(facts)} "
                f"(see {self.prefix}facts)"
            )
        fact = facts[number - 1]
        # Its text leaves the outbox too (earlier !facts and !remember replies); this reply
        # does not quote it, so no new row holds it. Scrubbed first: the removal is the
        # effect marked done, after which a replay never picks "fact n" again.
        await self._store.scrub_outbox(conv.id, fact.text)
        await self._store.remove_fact(conv.id, fact.id, done=held)
        left = len(facts) - 1
        return f"Removed fact {number} and its history; {left} left ({self.prefix}facts)."
