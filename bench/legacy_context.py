"""The context builder as it was before the cache-stable layout (commit 5afab4e), kept verbatim
so ``bench.prefix`` and ``bench.real_llm`` can measure the old layout next to the new one in
the same run. Not used by the bot.

Context assembly under a per-transport token budget.

Order (so the prompt prefix stays stable between turns and llama.cpp/Ollama reuse their KV
cache): system prompt -> pinned facts -> rolling summary -> retrieved older turns (dated,
chronological) -> recent window -> the new message.

Invariants:
- The assembled prompt never exceeds the budget as counted by the injected counter (each part's
  tokens plus per-message and per-join overheads are summed conservatively).
- History turns are never split: a turn is a run of user messages with the assistant messages
  that answered them; the window holds whole turns, newest first, and is contiguous.
- Nothing before the conversation's reset mark is used (store queries are bounded by it).
- Retrieval only looks at turns older than the window, so nothing appears twice; when it finds
  nothing good, its share of the budget goes to a longer window.
- A reply to an older message (Discord reply, ``parent_id``) brings its reply chain (up to
  ``THREAD_HOPS``, after the reset mark, older than the window) into the retrieved block first.
- Only the new message may be cut (a 100 KB paste); the stored copy stays whole, and
  ``trimmed`` tells the responder to say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bot.llm.port import ChatMessage, Role
from bot.llm.tokens import MESSAGE_OVERHEAD, TokenCounter
from bot.memory.context import LongtermRead
from bot.memory.port_derived import Derived, SessionLog
from bot.memory.port_log import ConversationLog
from bot.memory.retrieval import RetrievedBlock, Retriever
from bot.memory.store import ASSISTANT, USER, Conversation, StoredMessage


class LegacyStore(ConversationLog, Derived, SessionLog, Protocol):
    """What the legacy context builder reads."""


FACTS_HEADER = "Notes this person asked you to remember:"
SUMMARY_HEADER = "Summary of the earlier conversation:"
RETRIEVED_HEADER = "Earlier messages that may be relevant (dated):"
JOIN_OVERHEAD = 2  # tokens a "\n\n" join and header line break may add
WINDOW_FETCH_MAX = 400
MIN_NEW_MESSAGE_TOKENS = 16
FACTS_MAX_SHARE = 0.25
SUMMARY_MAX_SHARE = 0.25
THREAD_HOPS = 4  # how far up a reply chain the context follows (answer, question, ...)


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    tokens: int
    text: str


@dataclass(frozen=True, slots=True)
class AssembledContext:
    messages: list[ChatMessage]
    blocks: list[Block]
    tokens: int
    budget: int
    window: list[StoredMessage] = field(default_factory=list)
    retrieved: list[StoredMessage] = field(default_factory=list)
    retrieved_reasons: dict[int, str] = field(default_factory=dict)  # id -> why (memory show)
    trimmed: bool = False  # the new message, facts or summary had to be cut
    reserved: int = 0  # held back for the long-term tier (``LayeredContext``)
    longterm_text: str = ""  # the tier's block as read through ``longterm``

    @property
    def window_start_id(self) -> int | None:
        return self.window[0].id if self.window else None


def group_turns(messages: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
    """Chronological messages -> turns (user run + the assistant run answering it).

    Leading assistant messages with no user message before them are dropped (their question is
    outside the range), so every turn starts with the person speaking.
    """
    turns: list[list[StoredMessage]] = []
    for msg in messages:
        if msg.role == USER and (not turns or turns[-1][-1].role == ASSISTANT):
            turns.append([msg])
        elif turns:
            turns[-1].append(msg)
    return turns


class ContextBuilder:
    def __init__(
        self,
        *,
        store: LegacyStore,
        retriever: Retriever,
        counter: TokenCounter,
        system_prompt: str,
        retrieval_share: float,
    ) -> None:
        self._store = store
        self._retriever = retriever
        self._counter = counter
        self._system_prompt = system_prompt
        self._share = retrieval_share
        self._header_tokens = {
            h: counter.count(h) + JOIN_OVERHEAD
            for h in (FACTS_HEADER, SUMMARY_HEADER, RETRIEVED_HEADER)
        }

    async def build(
        self,
        conversation: Conversation,
        *,
        new_text: str,
        new_message_id: int | None,
        budget: int,
        style_hint: str = "",
        longterm_reserve: int = 0,
        longterm: LongtermRead | None = None,
        speaker: str | None = None,  # bench conversations are DMs: nobody to name
        system_prompt: str | None = None,  # no persona in the bench
    ) -> AssembledContext:
        reserved = 0  # held back for the long-term tier around this builder, as it was
        longterm_text = ""
        if longterm_reserve and await self._store.has_longterm_summary(conversation.id):
            reserved = longterm_reserve
            if longterm is not None:  # the newest version, as the tier showed it then
                longterm_text = await longterm(0, None)
        budget -= reserved
        trimmed = False
        system = f"{self._system_prompt} {style_hint}".strip()
        system_tokens = self._counter.count(system) + MESSAGE_OVERHEAD
        blocks = [Block("system", system_tokens, system)]
        free = budget - system_tokens

        # The new message: always present, cut only if it alone would not leave room.
        new_tokens = self._counter.count(new_text) + MESSAGE_OVERHEAD
        if new_tokens > free:
            new_text = self._cut(new_text, max(free - MESSAGE_OVERHEAD - 4, 0)) + " […]"
            new_tokens = self._counter.count(new_text) + MESSAGE_OVERHEAD
            trimmed = True
        if new_tokens > free:  # even the system prompt leaves no room: send the message alone
            raise ValueError(f"budget {budget} cannot hold the system prompt and a message")
        free -= new_tokens

        facts_text, facts_tokens, cut = await self._facts(conversation, free)
        trimmed |= cut
        free -= facts_tokens
        if facts_text:
            blocks.append(Block("facts", facts_tokens, facts_text))

        summary_text = ""
        summary = await self._store.latest_summary(conversation)
        if summary is not None:
            cost = summary.tokens + self._header_tokens[SUMMARY_HEADER]
            if cost <= free * SUMMARY_MAX_SHARE:
                summary_text = f"{SUMMARY_HEADER}\n{summary.text}"
                free -= cost
                blocks.append(Block("summary", cost, summary_text))
            else:
                trimmed = True

        # Recent window (first pass), then retrieval over what is older, then more window.
        fetch = min(WINDOW_FETCH_MAX, max(free // 8, 8))
        recent = await self._store.recent_messages(
            conversation, limit=fetch, before_id=new_message_id
        )
        everything_fetched = len(recent) < fetch  # nothing older since the reset mark
        turns = group_turns(list(reversed(recent)))
        window: list[list[StoredMessage]] = []
        used = 0
        first_cap = int(free * (1 - self._share))
        while turns:
            cost = _turn_cost(turns[-1])
            if used + cost > first_cap:
                break
            window.insert(0, turns.pop())
            used += cost

        block = RetrievedBlock()
        retrieve_budget = free - used - self._header_tokens[RETRIEVED_HEADER]
        # A short conversation that fits the window whole has nothing older to search.
        if retrieve_budget > 0 and not (everything_fetched and not turns):
            before = window[0][0].id if window else (new_message_id or 1 << 62)
            thread: list[StoredMessage] = []
            if new_message_id is not None:  # a reply: the chain it answers, if out of the window
                chain = await self._store.ancestors(new_message_id, limit=THREAD_HOPS)
                thread = [m for m in chain if conversation.reset_after < m.id < before]
            block = await self._retriever.retrieve(
                conversation,
                new_text,
                budget_tokens=retrieve_budget,
                before_id=before,
                thread=thread,
            )
        retrieved_tokens = (
            block.tokens + self._header_tokens[RETRIEVED_HEADER] if block.turns else 0
        )
        retrieved_ids = {m.id for m in block.turns}
        while turns:  # leftover budget lengthens the window, stopping at a retrieved turn
            turn = turns[-1]
            cost = _turn_cost(turn)
            if used + retrieved_tokens + cost > free or any(m.id in retrieved_ids for m in turn):
                break
            window.insert(0, turns.pop())
            used += cost
        if block.turns:
            blocks.append(Block("retrieved", retrieved_tokens, f"{RETRIEVED_HEADER}\n{block.text}"))

        system_text = "\n\n".join(b.text for b in blocks)
        messages = [ChatMessage("system", system_text)]
        flat = [m for turn in window for m in turn]
        messages.extend(_alternate(flat, new_text))
        blocks.append(Block("window", used, f"{len(flat)} messages"))
        blocks.append(Block("new", new_tokens, new_text))
        total = sum(b.tokens for b in blocks)
        return AssembledContext(
            messages=messages,
            blocks=blocks,
            tokens=total,
            budget=budget,
            window=flat,
            retrieved=list(block.turns),
            retrieved_reasons=dict(block.reasons),
            trimmed=trimmed,
            reserved=reserved,
            longterm_text=longterm_text,
        )

    async def _facts(self, conversation: Conversation, free: int) -> tuple[str, int, bool]:
        facts = await self._store.facts(conversation.id)
        if not facts:
            return "", 0, False
        cap = int(free * FACTS_MAX_SHARE)
        lines: list[str] = []
        used = self._header_tokens[FACTS_HEADER]
        cut = False
        for fact in reversed(facts):  # newest facts win when they do not all fit
            cost = fact.tokens + 2
            if used + cost > cap:
                cut = True
                continue
            lines.insert(0, f"- {fact.text}")
            used += cost
        if not lines:
            return "", 0, cut
        return FACTS_HEADER + "\n" + "\n".join(lines), used, cut

    def _cut(self, text: str, tokens: int) -> str:
        """Longest prefix of ``text`` within ``tokens`` (binary search on characters)."""
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._counter.count(text[:mid]) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo]


def _turn_cost(turn: Sequence[StoredMessage]) -> int:
    return sum(m.tokens + MESSAGE_OVERHEAD for m in turn)


def _alternate(window: Sequence[StoredMessage], new_text: str) -> list[ChatMessage]:
    """Window + new message as strictly alternating user/assistant messages, user first and
    last (some chat templates reject anything else): runs of one role are joined."""
    out: list[tuple[Role, str]] = []
    for msg in [*window]:
        role: Role = "user" if msg.role == USER else "assistant"
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + "\n\n" + msg.text)
        else:
            out.append((role, msg.text))
    if out and out[-1][0] == "user":
        out[-1] = ("user", out[-1][1] + "\n\n" + new_text)
    else:
        out.append(("user", new_text))
    return [ChatMessage(role, text) for role, text in out]
