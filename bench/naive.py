"""The naive context strategy the benchmark compares against: what existing bots do.

Load the whole conversation (every message since the reset mark), then keep the newest whole
turns that fit the budget after the system prompt and the new message. No facts, no summary, no
retrieval. It has the same ``build`` signature and result type as ``ContextBuilder``, so the
responder runs it unchanged.
"""

from __future__ import annotations

from bench.legacy_context import _alternate, _turn_cost
from bot.llm.port import ChatMessage
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter
from bot.memory.context import AssembledContext, Block, LongtermRead, group_turns
from bot.memory.port_log import ConversationLog
from bot.memory.store import Conversation, StoredMessage

WHOLE_CONVERSATION = 1 << 62


class NaiveContextBuilder:
    def __init__(
        self, *, store: ConversationLog, counter: TokenCounter, system_prompt: str
    ) -> None:
        self._store = store
        self._counter = counter
        self._system_prompt = system_prompt

    async def build(
        self,
        conversation: Conversation,
        *,
        new_text: str,
        new_message_id: int | None,
        budget: int,
        style_hint: str = "",
        longterm_reserve: int = 0,  # no summary of any kind: nothing is held back for one
        longterm: LongtermRead | None = None,  # (so none is read)
        speaker: str | None = None,  # bench conversations are DMs: nobody to name
        system_prompt: str | None = None,  # no persona in the bench
    ) -> AssembledContext:
        system = f"{self._system_prompt} {style_hint}".strip()
        system_tokens = self._counter.count(system) + MESSAGE_OVERHEAD
        new_tokens = self._counter.count(new_text) + MESSAGE_OVERHEAD
        free = budget - system_tokens - new_tokens
        history = await self._store.messages_between(
            conversation.id,
            after_id=conversation.reset_after,
            up_to_id=(new_message_id - 1) if new_message_id else WHOLE_CONVERSATION,
        )
        turns = group_turns(history)
        window: list[list[StoredMessage]] = []
        used = 0
        while turns and used + _turn_cost(turns[-1]) <= free:
            used += _turn_cost(turns[-1])
            window.insert(0, turns.pop())
        flat = [m for turn in window for m in turn]
        blocks = [
            Block("system", system_tokens, system),
            Block("window", used, f"{len(flat)} messages"),
            Block("new", new_tokens, new_text),
        ]
        messages = [ChatMessage("system", system), *_alternate(flat, new_text)]
        return AssembledContext(
            messages=messages,
            blocks=blocks,
            tokens=system_tokens + used + new_tokens,
            budget=budget,
            window=flat,
        )
