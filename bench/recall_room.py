"""Evidence in a reply's recall when a slow server holds it to a few hundred tokens.

    python -m bench.recall_room ../shared/bench/locomo-dev.json [--rooms 80 200 400 800]
        [--note 64] [--set neighbour=0.5 ...] [--conversations 2]

The quick loop beside ``bench.memory_e2e`` (about 20 s for the five dev conversations where
the end-to-end run takes 3-17 minutes): every turn of a conversation goes into a real SQLite
store (speaker A the person, B the bot, as in ``bench.recall``), and each question of
categories 1-4 is asked of the bot's own ``Retriever`` exactly as ``ContextBuilder`` asks it on
a server whose learned prompt speed times ``recall_seconds`` is the room (the message's recall
weight, its floor, the complete-match cut, no spare room), counted by the bot's counter; the
block is then split as a reply splits it (``RetrievedBlock.split``: the note, at most
``--note`` tokens, and the part shown once). Scored as ``bench.memory_e2e`` scores a prompt:
the share of a question's evidence turns whose text is recalled. The window is left out (the
end-to-end figure adds the evidence it holds), so this is what recall alone brings.

Printed per room: recall per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop),
for 1-4, per conversation (the spread a change must beat), and the recalled tokens' mean.
Nothing from the LoCoMo data (CC BY-NC 4.0) is written into the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.recall import Dialogue, _overrides, load
from bot.config import RetrievalConfig
from bot.domain import ConversationKey
from bot.llm.tokens import make_counter
from bot.memory.context import MIN_RECALL_TOKENS, RELATIVE_SCORE, recall_weight
from bot.memory.retrieval import Retriever
from bot.memory.store import ASSISTANT, USER, SqliteStore

CATEGORIES = (1, 2, 3, 4)
ROOMS = (80, 200, 400, 800)


async def measure(
    dialogues: Sequence[Dialogue], *, rooms: Sequence[int], note: int, config: RetrievalConfig
) -> dict[tuple[int, str], list[float]]:
    """Per (room, category as "1".."4", "all" or a conversation's id): each question's score;
    (room, "tokens"): the tokens each recall used."""
    counter = make_counter()
    out: dict[tuple[int, str], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="meshsage-room-") as tmp:
        for n, dlg in enumerate(dialogues):
            store = await SqliteStore.open(Path(tmp) / f"{n}.db")
            try:
                conv = await store.conversation(ConversationKey("bench", dlg.speaker_a, "dm"))
                rows = [
                    (USER if t.speaker == dlg.speaker_a else ASSISTANT, t.speaker, t.text,
                     counter.count(t.text), t.created_at)
                    for t in dlg.turns
                ]  # fmt: skip
                await store.add_messages(conv.id, rows)
                messages = await store.all_messages(conv.id)
                id_of = {t.dia_id: m.id for t, m in zip(dlg.turns, messages, strict=True)}
                retriever = Retriever(store=store, counter=counter, config=config)
                end = messages[-1].id + 1
                for q in dlg.questions:
                    if q.category not in CATEGORIES:
                        continue
                    want = {id_of[e] for e in q.evidence}
                    for room in rooms:
                        block = await retriever.retrieve(
                            conv, q.text, budget_tokens=room, before_id=end,
                            weight=recall_weight, floor=MIN_RECALL_TOKENS,
                            relative=RELATIVE_SCORE,
                        )  # fmt: skip
                        held, rest = block.split(counter, note, room=1 << 30)
                        got = {m.id for m in held.turns} | {m.id for m in rest.turns}
                        s = len(want & got) / len(want)
                        for key in (str(q.category), "all", dlg.sample_id):
                            out[(room, key)].append(s)
                        out[(room, "tokens")].append(held.tokens + rest.tokens)
            finally:
                await store.close()
    return out


def table(
    scores: dict[tuple[int, str], list[float]], rooms: Sequence[int], names: Sequence[str]
) -> str:
    def mean(key: tuple[int, str]) -> str:
        values = scores.get(key, [])
        return f"{sum(values) / len(values):.3f}" if values else "-"

    cats = " | ".join(f"cat {c}" for c in CATEGORIES)
    lines = [
        f"| room (tokens) | {cats} | all 1-4 | per conversation ({', '.join(names)}) | tokens |",
        "|---:|" + "---:|" * (len(CATEGORIES) + 1) + "---|---:|",
    ]
    for room in rooms:
        per = " / ".join(mean((room, n)) for n in names)
        cells = " | ".join(mean((room, str(c))) for c in CATEGORIES)
        used = scores.get((room, "tokens"), [])
        tokens = f"{sum(used) / len(used):.0f}" if used else "-"
        lines.append(f"| {room} | {cells} | **{mean((room, 'all'))}** | {per} | {tokens} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.recall_room", description=__doc__.split("\n")[0]
    )
    p.add_argument("data", type=Path, help="LoCoMo-format JSON (../shared/bench/locomo-dev.json)")
    p.add_argument("--rooms", type=int, nargs="+", default=list(ROOMS))
    p.add_argument("--note", type=int, default=MIN_RECALL_TOKENS, help="the note's tokens")
    p.add_argument("--conversations", type=int, default=None, help="only the first N")
    p.add_argument("--set", nargs="*", default=[], help="memory.retrieval overrides, key=json")
    args = p.parse_args(argv)
    dialogues = load(args.data)[: args.conversations]
    scores = asyncio.run(
        measure(dialogues, rooms=args.rooms, note=args.note, config=_overrides(args.set))
    )
    print(table(scores, args.rooms, [d.sample_id for d in dialogues]))


if __name__ == "__main__":
    main()
