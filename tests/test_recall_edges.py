"""Recall edge cases from issue 17's list not covered in tests/test_recall_notes.py: a history
where every turn matches the question (one repeated phrase), asked again and again. Every
prompt stays within its budget, recall stays within ``retrieval.share``, and no turn appears
twice in one prompt (window, notes and recall never repeat each other). Both stores."""

from __future__ import annotations

import re
from collections import Counter

from bot.llm.tokens import MESSAGE_OVERHEAD
from bot.memory.port import MemoryStore
from tests.test_recall_notes import BUDGET, COUNTER, _ask, _builder, _pair, _recalled

READING = re.compile(r"The ridge weather station read (\d+) degrees at noon")
SHARE = 0.4


async def test_every_turn_matches_a_repeated_phrase(memory: MemoryStore) -> None:
    at = 1_700_000_000.0
    for n in range(80):
        await _pair(memory, f"The ridge weather station read {n} degrees at noon today.",
                    f"Noted: {n} degrees.", at)  # fmt: skip
        at += 60
    builder = _builder(memory, share=SHARE)
    system = COUNTER.count("You are a test bot.") + MESSAGE_OVERHEAD
    recalled_any = False
    for i in range(6):
        messages, _ = await _ask(memory, builder, "What did the ridge weather station read "
                                 "at noon?", answer=f"It varied ({i}).")  # fmt: skip
        shown = Counter(n for m in messages for n in READING.findall(m.content))
        repeated = {n: c for n, c in shown.items() if c > 1}
        assert not repeated, repeated  # no turn twice in one prompt
        recall = _recalled(messages)
        recalled_any = recalled_any or bool(recall)
        assert COUNTER.count(recall) <= SHARE * (BUDGET - system) + 8
    assert recalled_any  # the older readings were recalled, not only the window shown
