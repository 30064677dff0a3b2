"""bench.prefix's account of what breaks the prefix between two replies (``--why``): the part
of the previous request where the next one first differs, and the tokens re-read from there."""

from __future__ import annotations

from typing import Any

from bench.prefix import breaks, first_break
from bot.llm.tokens import make_counter
from bot.memory.context import MORE_HEADER, RETRIEVED_HEADER, SUMMARY_HEADER

SYSTEM = "You are a bot."


def _req(system: str, *turns: str) -> dict[str, Any]:
    roles = ["user", "assistant"] * len(turns)
    return {
        "messages": [
            {"role": "system", "content": system},
            *({"role": r, "content": t} for r, t in zip(roles, turns, strict=False)),
        ]
    }


def test_the_first_change_is_named_by_the_part_that_holds_it() -> None:
    note = f"{RETRIEVED_HEADER}\nalice: my boat is Osprey)"
    rest = f"{MORE_HEADER}\nalice: she is moored north)"
    chapters = f"{SYSTEM}\n\n{SUMMARY_HEADER}\nThey talked about boats."
    asked = _req(chapters, "hi", "hello", f"{note}\n\n{rest}\n\nwhere is my boat?")
    # The next turn keeps the note with its message, not the rest: it breaks in the rest.
    nxt = _req(chapters, "hi", "hello", f"{note}\n\nwhere is my boat?", "North.", "thanks")
    assert first_break(asked["messages"], nxt["messages"])[0] == "final: recall, once"
    # A plain next turn extends the previous request.
    after = _req(chapters, "hi", "hello", f"{note}\n\nwhere is my boat?", "North.", "thanks", "ok")
    assert first_break(nxt["messages"], after["messages"])[0] == "nothing (extends it)"
    # A fold: a new chapter at the end of the system message.
    folded = _req(chapters + "\n\nThey talked about the mooring.", "thanks")
    assert first_break(after["messages"], folded["messages"])[0] == "system: chapters"
    got = breaks([asked, nxt, after, folded], ["alice"] * 4, make_counter(), one_slot=True)
    assert {k: n for k, (n, _t) in got.items()} == {
        "final: recall, once": 1,
        "nothing (extends it)": 1,
        "system: chapters": 1,
    }
    assert all(t > 0 for _n, t in got.values())
