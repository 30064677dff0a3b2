"""bench.recall_room: the reply's own retrieval and note/once split on a small synthetic
conversation (written for this test, not LoCoMo): the evidence a question needs is recalled
when the room holds it, and the table prints every room and category asked."""

from __future__ import annotations

from bench.recall import Dialogue, Question, Turn
from bench.recall_room import measure, table
from bot.config import RetrievalConfig


def _dialogue() -> Dialogue:
    turns = [Turn("d0", "A", "My boat is called Osprey and she is moored at the north pier.", 0.0),
             Turn("d1", "B", "Lovely name for a boat.", 1.0)]  # fmt: skip
    for i in range(2, 60):
        turns.append(Turn(f"d{i}", "A" if i % 2 == 0 else "B", f"Small talk about soup {i}.", i))
    questions = [Question("Where is the boat Osprey moored?", ("d0",), 4),
                 Question("What did I say about soup 7 and soup 9?", ("d7", "d9"), 1)]  # fmt: skip
    return Dialogue("synthetic", "A", turns, questions)


async def test_the_evidence_is_recalled_when_the_room_holds_it() -> None:
    scores = await measure([_dialogue()], rooms=[80, 200], note=64, config=RetrievalConfig())
    assert scores[(80, "4")] == [1.0] and scores[(200, "4")] == [1.0]
    assert scores[(200, "1")] == [1.0]
    assert all(0 < t <= 200 + 16 for t in scores[(200, "tokens")])
    printed = table(scores, [80, 200], ["synthetic"])
    assert "| 80 |" in printed and "| 200 |" in printed and "synthetic" in printed
