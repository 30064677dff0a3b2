"""Asking the LLM with a prompt that fits the server: the responder's one way to call it.

Invariants:
- The prompt budget is the transport's ``context_tokens`` or less: what the server holds, as
  learned (``bot.llm.server_limits``), minus the answer's tokens; the answer is the
  transport's ``max_tokens`` or less on a small context.
- A prompt the server refuses as too long (``ContextTooLong`` in any form) is never an
  outage: the server's limits are looked up again (a server restarted with a smaller context
  says so only now) and the size its error names is kept; the prompt is rebuilt smaller (the
  learned room, or two thirds of its tokens, whichever is less, never under
  ``MIN_RETRY_BUDGET``) and asked again, up to ``MAX_SHRINKS`` times. Only a server that
  refuses even the smallest prompt ends the turn with ``ContextTooLong``; the responder then
  tells the person ``TOO_LONG`` and the operator the fix.
- Each rebuild is the ordinary context assembly at a smaller budget, so the new message is
  answered (cut if it alone is too long, which the context reports as ``trimmed``). A budget
  that cannot hold the system prompt and a message at all is ``ContextTooLong`` too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from bot.config import BotConfig
from bot.domain import Inbound, TransportLimits
from bot.llm.port import LLM, ChatMessage, Completion, ContextTooLong, OnText
from bot.llm.server_limits import LearnedLimits, prompt_from_error
from bot.memory.context import AssembledContext
from bot.memory.layers import LayeredContext
from bot.memory.records import Conversation

log = logging.getLogger("bot.responder")

MIN_RETRY_BUDGET = 128  # a server refusing even this needs its context raised
MAX_SHRINKS = 3  # rebuilds of one prompt a server refused as too long
TOO_LONG = (
    "I could not fit our conversation into the model's memory, even shortened. Try a shorter "
    "message, or {prefix}reset."
)


class FittingAsk:
    def __init__(
        self,
        *,
        llm: LLM,
        context: LayeredContext,
        config: BotConfig,
        server: LearnedLimits | None = None,
    ) -> None:
        self._llm = llm
        self._context = context
        self._config = config
        self._server = server  # what the LLM server holds (None: the config stands)

    async def budget(self, limits: TransportLimits) -> tuple[int, int]:
        """(prompt tokens, answer tokens): the transport's, or less if the server holds less."""
        if self._server is None:
            return limits.context_tokens, limits.max_tokens
        await self._server.ensure()
        await self._server.check_loaded()  # Ollama keep_alive: a load is not an outage
        # with the server's token counts as heard: a prompt it counts more of still fits
        return self._server.budget(
            context_tokens=limits.context_tokens, max_tokens=limits.max_tokens
        )

    async def ask(
        self,
        conv: Conversation,
        inbound: Inbound,
        message_id: int | None,
        limits: TransportLimits,
        *,
        on_text: OnText | None = None,
        ephemeral: list[tuple[str, str]] | None = None,
        speaker: str | None = None,
        system_prompt: str | None = None,
        before_call: Callable[[AssembledContext], None] | None = None,
        model: str | None = None,
    ) -> tuple[AssembledContext, Completion]:
        """Build the prompt within the budget and ask; a prompt the server refuses as too long
        is rebuilt smaller and asked again (see the module docstring). ``before_call`` sees
        each prompt just before it is sent (the summarizer keeps the slot for a debt fold);
        ``model``: the one chosen for the conversation (None: the configured one)."""
        budget, answer = await self.budget(limits)
        shrinks = 0
        while True:
            try:
                ctx = await self._context.build(
                    conv,
                    new_text=inbound.text[: self._config.max_message_chars],
                    new_message_id=message_id,
                    budget=budget,
                    style_hint=limits.style_hint,
                    ephemeral=ephemeral or (),
                    speaker=speaker,
                    system_prompt=system_prompt,
                )
            except ValueError as exc:  # the server's room is below the system prompt's size
                log.warning("the LLM server's context leaves %d prompt tokens, too few for %s "
                            "(%s). Fix: raise the server's context (llama.cpp --n_ctx, Ollama "
                            "num_ctx)", budget, inbound.key, exc)  # fmt: skip
                raise ContextTooLong(f"{exc}; the server's context leaves no more") from None
            messages: list[ChatMessage] = list(ctx.messages)
            if inbound.images:  # for the model only, with the new message (never stored)
                messages = [*messages[:-1], replace(messages[-1], images=inbound.images)]
            if before_call is not None:
                before_call(ctx)
            try:
                completion = await self._llm.complete(
                    messages, max_tokens=answer, on_text=on_text, model=model
                )
                return ctx, completion
            except ContextTooLong as exc:  # the server holds less than we thought
                smaller = ctx.tokens * 2 // 3
                if self._server is not None:
                    await self._server.refresh()  # restarted with a smaller n_ctx?
                    self._server.heard_overflow(exc.server_message)
                    room, answer = self._server.budget(
                        context_tokens=limits.context_tokens, max_tokens=answer
                    )
                    smaller = min(smaller, room)
                    said = prompt_from_error(exc.server_message)  # the server's own count
                    if said and said > ctx.tokens:  # it counts more than we do: scale down
                        smaller = min(smaller, room * ctx.tokens // said)
                smaller = max(MIN_RETRY_BUDGET, smaller)
                shrinks += 1
                if shrinks > MAX_SHRINKS or smaller >= ctx.tokens:
                    log.warning("the LLM server refuses even a %d-token prompt for %s. Fix: "
                                "raise the server's context (llama.cpp --n_ctx, Ollama "
                                "num_ctx)", ctx.tokens, inbound.key)  # fmt: skip
                    raise
                log.warning("the LLM server refused a %d-token prompt for %s as too long; "
                            "asking again with %d tokens", ctx.tokens, inbound.key,
                            smaller)  # fmt: skip
                budget = smaller
