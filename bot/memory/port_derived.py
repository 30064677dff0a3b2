"""The ports of what the bot derives from the log: summary chapters and facts (``Derived``,
``bot.memory.core.derived``), sessions and the long-term summary (``SessionLog``,
``bot.memory.core.sessions``).

Invariants every implementation keeps:
- Summaries are chapters: a saved summary replaces only the rows whose message range it
  covers, so folds append chapters and a merge (one row over several ranges) replaces them.
  ``latest_summary`` and ``summaries`` read only what is past the conversation's reset mark,
  and ``save_summary`` refuses a summary that starts at or before it.
- Pinned facts (``!remember``) are never changed by ``update_fact`` or by
  ``remove_fact(extracted_only=True)``; ``revise_fact`` (a new value for the same subject)
  may change any fact. Both keep the replaced text in the fact's ``history`` (at most
  ``FACT_HISTORY`` entries), which goes with the fact when it is removed or forgotten.
- ``facts_through`` (the fact extraction mark) only moves forward; ``load_dump`` sets it past
  the imported messages (their facts are imported with them). ``link_dm`` keeps the promise
  that each message is read for facts once: the home's mark becomes the later of both marks,
  and the messages of either side past their own mark but not past it are flagged
  (``facts_pending``) and read by the next extraction.
- Sessions of a conversation never overlap (``add_session`` returns None instead,
  ``add_sessions`` skips the span); they are ordered by message id, never by clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bot.memory.records import (
    Conversation,
    Fact,
    LongTermSummary,
    Session,
    SessionSpan,
    StoredMessage,
    Summary,
)


class Derived(Protocol):
    """Summary chapters and facts of a conversation, with the facts' extraction mark."""

    async def latest_summary(self, conversation: Conversation) -> Summary | None: ...

    async def summaries(self, conversation: Conversation) -> list[Summary]:
        """Summary chapters after the reset mark, oldest first (non-overlapping ranges)."""
        ...

    async def save_summary(
        self,
        conversation_id: int,
        *,
        text: str,
        first_message_id: int,
        last_message_id: int,
        tokens: int,
    ) -> bool: ...

    async def facts(self, conversation_id: int) -> list[Fact]: ...

    async def add_fact(
        self,
        conversation_id: int,
        *,
        text: str,
        tokens: int,
        pinned: bool = True,
        source_ids: Sequence[int] = (),
        created_at: float | None = None,
        done: int | None = None,
    ) -> int: ...

    async def update_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        text: str,
        tokens: int,
        source_ids: Sequence[int],
        updated_at: float | None = None,
    ) -> bool: ...

    async def revise_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        text: str,
        tokens: int,
        pinned: bool,
        source_ids: Sequence[int],
        updated_at: float | None = None,
        done: int | None = None,
    ) -> Fact | None: ...

    async def remove_fact(
        self,
        conversation_id: int,
        fact_id: int,
        *,
        extracted_only: bool = False,
        done: int | None = None,
    ) -> bool: ...

    async def facts_through(self, conversation_id: int) -> int: ...

    async def set_facts_through(self, conversation_id: int, message_id: int) -> None: ...

    async def facts_pending(self, conversation_id: int) -> list[StoredMessage]: ...


class SessionLog(Protocol):
    """Sessions (stretches of talk between long silences) and the long-term summary."""

    async def sessions(self, conversation_id: int, *, limit: int = 1000) -> list[Session]: ...

    async def session_end(self, conversation_id: int) -> int: ...

    async def add_session(
        self,
        conversation_id: int,
        *,
        first_message_id: int,
        last_message_id: int,
        started_at: float,
        ended_at: float,
        messages: int,
    ) -> int | None: ...

    async def add_sessions(self, conversation_id: int, spans: Sequence[SessionSpan]) -> list[int]:
        """Several closed sessions (message order) in one transaction; new ids in order."""
        ...

    async def set_session_summary(
        self, session_id: int, *, title: str, summary: str, tokens: int
    ) -> bool: ...

    async def clear_sessions(self, conversation_id: int) -> int: ...

    async def unsummarized_sessions(
        self, *, limit: int, ended_after: float = 0.0
    ) -> list[Session]: ...

    async def idle_conversations(self, *, idle_before: float, limit: int) -> list[int]: ...

    async def longterm_summary(
        self,
        conversation_id: int,
        *,
        up_to: int | None = None,
        written_before: float | None = None,
    ) -> LongTermSummary | None: ...

    async def has_longterm_summary(self, conversation_id: int) -> bool: ...

    async def save_longterm_summary(
        self,
        conversation_id: int,
        *,
        text: str,
        tokens: int,
        sessions: int,
        up_to_message_id: int,
        updated_at: float | None = None,
    ) -> None: ...
