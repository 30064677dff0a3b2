"""The memory tiers around the turn-level context: long-term summary, incognito turns, use counts.

``LayeredContext`` wraps the ``ContextBuilder``. It places the conversation's long-term summary
(built from session summaries) right after the system prompt, counts a use of every retrieved
turn (forgetting by use keeps what is used), and adds the in-memory turns of an incognito
session, which are never stored, to the final message.

Invariants:
- The assembled prompt stays within the budget: once a conversation has a long-term summary, a
  constant ``reserve`` is taken from the inner builder's budget (constant, so the inner
  builder's window and fold points do not move when a new version is written).
- Cache-stable (issue 9's layout): the version shown is the newest one covering no message
  after the window's base (``folded_up_to``) and written before the newest summary chapter, so
  it changes only at a fold, never between two turns of one window; newer versions wait.
- ``!reset`` hides every version built before it (a version is cumulative, and one built
  after the reset starts afresh, see bot.memory.sessions).
- Incognito turns ride in the final message only, so the stored prefix stays byte-identical.
- The long-term summary belongs to one conversation (a DM's never reaches a channel prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from bot.llm.port import ChatMessage
from bot.llm.tokens import TokenCounter
from bot.memory.context import JOIN_OVERHEAD, AssembledContext, Block, ContextBuilder
from bot.memory.port_derived import SessionLog
from bot.memory.port_recall import Recall
from bot.memory.records import Conversation
from bot.memory.sessions import LONGTERM_TOKENS


class LayerStore(SessionLog, Recall, Protocol):
    """What the long-term layer reads and notes."""


LONGTERM_HEADER = "What you know from earlier sessions with this person:"
INCOGNITO_HEADER = "(Earlier in this incognito session, not stored:"
LONGTERM_MAX_SHARE = 0.2
INCOGNITO_MAX_SHARE = 0.3


class LayeredContext:
    def __init__(self, *, inner: ContextBuilder, store: LayerStore, counter: TokenCounter) -> None:
        self.inner = inner
        self._store = store
        self._counter = counter
        self._header_tokens = counter.count(LONGTERM_HEADER) + JOIN_OVERHEAD

    def reserve(self, budget: int) -> int:
        """Tokens kept for the long-term block (constant per budget)."""
        return min(LONGTERM_TOKENS + self._header_tokens, int(budget * LONGTERM_MAX_SHARE))

    async def build(
        self,
        conversation: Conversation,
        *,
        new_text: str,
        new_message_id: int | None,
        budget: int,
        style_hint: str = "",
        ephemeral: Sequence[tuple[str, str]] = (),
        speaker: str | None = None,
        system_prompt: str | None = None,
    ) -> AssembledContext:
        note = self._incognito_note(ephemeral, budget) if ephemeral else ""
        note_tokens = self._counter.count(note) + JOIN_OVERHEAD if note else 0

        async def longterm(up_to: int, written_before: float | None) -> str:
            # As of the last fold: covering only what chapters hold (not the window), and
            # written before the newest chapter, so it changes only when a fold happens.
            found = await self._store.longterm_summary(
                conversation.id, up_to=up_to, written_before=written_before
            )
            if found is None or found.up_to_message_id <= conversation.reset_after:
                return ""  # none yet, or built before a !reset: nothing from before it
            return f"{LONGTERM_HEADER}\n{found.text}"

        ctx = await self.inner.build(  # holds the reserve back if there is a long-term summary
            conversation,
            new_text=new_text,
            new_message_id=new_message_id,
            budget=budget - note_tokens,
            style_hint=style_hint,
            longterm_reserve=self.reserve(budget),
            longterm=longterm,
            speaker=speaker,
            system_prompt=system_prompt,
        )
        reserved = ctx.reserved
        if ctx.retrieved:
            await self._store.note_retrieved([m.id for m in ctx.retrieved])
        blocks = list(ctx.blocks)
        messages = list(ctx.messages)
        tokens = ctx.tokens
        if reserved:
            text = ctx.longterm_text  # read by the inner builder, which left its unused room
            cost = self._counter.count(text) + JOIN_OVERHEAD if text else 0
            if text and cost <= reserved:
                system = messages[0]
                head = ctx.blocks[0].text  # the system prompt opens the system message
                tail = system.content[len(head) :].removeprefix("\n\n")
                content = "\n\n".join([head, text, *([tail] if tail else [])])
                messages[0] = ChatMessage("system", content)
                blocks.insert(1, Block("longterm", cost, text))
                tokens += cost
        if note:
            last = messages[-1]
            messages[-1] = ChatMessage(last.role, f"{note}\n\n{last.content}")
            blocks.append(Block("incognito", note_tokens, note))
            tokens += note_tokens
        if not reserved and not note:
            return ctx
        return replace(ctx, messages=messages, blocks=blocks, tokens=tokens, budget=budget)

    def _incognito_note(self, ephemeral: Sequence[tuple[str, str]], budget: int) -> str:
        lines: list[str] = []
        used = self._counter.count(INCOGNITO_HEADER) + JOIN_OVERHEAD + 1
        for who, said in reversed(ephemeral):  # newest first when they do not all fit
            line = f"{who}: {said}"
            cost = self._counter.count(line) + 1
            if used + cost > budget * INCOGNITO_MAX_SHARE:
                break
            lines.insert(0, line)
            used += cost
        return INCOGNITO_HEADER + "\n" + "\n".join(lines) + ")" if lines else ""
