"""Incognito stretches: the turns a gateway holds in memory, and when they end.

An incognito stretch runs from ``!incognito`` to ``!incognito off``, the next ``!incognito``,
``!reset`` or ``!forget`` (or a restart). Its messages and answers are never stored; the
gateway answering keeps the last ``INCOGNITO_TURNS`` exchanges in memory so the model can
follow the stretch.

Invariants:
- The store names the running stretch (``MemoryStore.incognito_stretch``: a random id, None
  when incognito is off). Every command that ends a stretch changes that id, on whichever
  gateway it arrives, for the person's conversations and those linked with them
  (``set_incognito``, ``end_incognito``; ``!forget`` deletes the rows).
- Held turns are keyed by (conversation id, stretch id) as read when a turn begins; every
  incognito turn reads the id again and starts empty when it changed, so nothing said in an
  ended stretch reaches a later prompt on any gateway. Nothing here is written anywhere.
"""

from __future__ import annotations

from collections import deque

from bot.domain import ConversationKey

INCOGNITO_TURNS = 20
Turns = deque[tuple[str, str]]  # ("person" | "you", text), oldest first


class HeldStretches:
    """The in-memory turns of the incognito stretches this process answers."""

    def __init__(self, turns: int = INCOGNITO_TURNS) -> None:
        self._maxlen = turns * 2
        self._held: dict[ConversationKey, tuple[tuple[int, str], Turns]] = {}

    def turns(self, key: ConversationKey, conversation_id: int, stretch: str | None) -> Turns:
        """The turns held for ``key`` in the stretch the store names now: empty (and the old
        ones dropped) when it is another stretch; a throwaway deque when incognito is off."""
        if stretch is None:
            self._held.pop(key, None)
            return deque(maxlen=self._maxlen)
        held = self._held.get(key)
        if held is None or held[0] != (conversation_id, stretch):
            held = ((conversation_id, stretch), deque(maxlen=self._maxlen))
            self._held[key] = held
        return held[1]

    def drop(self, key: ConversationKey, *, every_space: bool = False) -> None:
        """Forget the turns held for ``key`` (for every space of its person with
        ``every_space``) at once, without waiting for the next turn to notice."""
        person = (key.transport, key.person)
        for held in list(self._held):
            if held == key or (every_space and (held.transport, held.person) == person):
                del self._held[held]
