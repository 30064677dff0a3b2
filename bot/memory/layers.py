"""The memory tiers around the turn-level context: long-term summary, incognito turns, use counts.

``LayeredContext`` wraps the ``ContextBuilder``: it reserves room for the long-term summary
(rebuilt from session summaries only when a session closes, so it sits in the stable prefix
right after the system prompt and changes rarely), lets the inner builder assemble the rest in
the remaining budget, then places the summary after the system prompt. It also counts a use of
every retrieved turn (forgetting by use keeps what is used) and adds the in-memory turns of an
incognito session, which are never stored.

Invariants:
- The assembled prompt stays within the budget: the long-term block's tokens are taken from
  the inner builder's budget before it runs, and only when they fit ``LONGTERM_MAX_SHARE``.
- The long-term summary belongs to one conversation (a DM's never reaches a channel prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bot.llm.port import ChatMessage
from bot.llm.tokens import TokenCounter
from bot.memory.context import JOIN_OVERHEAD, AssembledContext, Block, ContextBuilder
from bot.memory.port import MemoryStore
from bot.memory.records import Conversation

LONGTERM_HEADER = "What you know from earlier sessions with this person:"
INCOGNITO_HEADER = "Earlier in this incognito session (not stored):"
LONGTERM_MAX_SHARE = 0.2
INCOGNITO_MAX_SHARE = 0.3


class LayeredContext:
    def __init__(self, *, inner: ContextBuilder, store: MemoryStore, counter: TokenCounter) -> None:
        self.inner = inner
        self._store = store
        self._counter = counter

    async def build(
        self,
        conversation: Conversation,
        *,
        new_text: str,
        new_message_id: int | None,
        budget: int,
        style_hint: str = "",
        ephemeral: Sequence[tuple[str, str]] = (),
    ) -> AssembledContext:
        extra: list[Block] = []
        longterm = await self._store.longterm_summary(conversation.id)
        if longterm is not None:
            text = f"{LONGTERM_HEADER}\n{longterm.text}"
            cost = self._counter.count(text) + JOIN_OVERHEAD
            if cost <= budget * LONGTERM_MAX_SHARE:
                extra.append(Block("longterm", cost, text))
        if ephemeral:
            lines: list[str] = []
            used = self._counter.count(INCOGNITO_HEADER) + JOIN_OVERHEAD
            for who, said in reversed(ephemeral):  # newest first when they do not all fit
                line = f"{who}: {said}"
                cost = self._counter.count(line) + 1
                if used + cost > budget * INCOGNITO_MAX_SHARE:
                    break
                lines.insert(0, line)
                used += cost
            if lines:
                extra.append(Block("incognito", used, INCOGNITO_HEADER + "\n" + "\n".join(lines)))
        reserved = sum(b.tokens for b in extra)
        ctx = await self.inner.build(
            conversation,
            new_text=new_text,
            new_message_id=new_message_id,
            budget=budget - reserved,
            style_hint=style_hint,
        )
        if ctx.retrieved:
            await self._store.note_retrieved([m.id for m in ctx.retrieved])
        if not extra:
            return ctx
        system, *rest = ctx.messages
        head = ctx.blocks[0].text  # the system prompt opens the system message
        tail = system.content[len(head) :].removeprefix("\n\n")
        # Long-term right after the system prompt (stable), incognito turns last (they change).
        before = [b.text for b in extra if b.name == "longterm"]
        after = [b.text for b in extra if b.name == "incognito"]
        content = "\n\n".join([head, *before, *([tail] if tail else []), *after])
        blocks = [ctx.blocks[0], *[b for b in extra if b.name == "longterm"], *ctx.blocks[1:]]
        blocks += [b for b in extra if b.name == "incognito"]
        return replace(
            ctx,
            messages=[ChatMessage("system", content), *rest],
            blocks=blocks,
            tokens=ctx.tokens + reserved,
            budget=budget,
        )
