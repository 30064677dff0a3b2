"""What a summary chapter keeps of the facts people later ask about, with a real small model.

    python -m bench.summary_facts ../shared/bench/locomo-dev.json --base-url URL --model NAME
        [--conversations 2] [--blocks 3]

For the first ``--blocks`` fold-sized blocks (the summarizer's own input bound) of each
conversation, the chapter prompt (``bot.memory.summary.CHAPTER_PROMPT``, and the one before
issue 17 for comparison) is sent with the block, formatted by the summarizer's own
``_fold_input``, to an OpenAI-compatible server (a llama.cpp server with a small model; see
docs/real_llm.md). The facts are the concrete words of the evidence turns of the questions
whose evidence lies in that block: numbers, capitalised names and month names. The score is
the share of those words found in the chapter (case-insensitive). Nothing is timed.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from openai import OpenAI

from bench.recall import load
from bot.llm.tokens import make_counter
from bot.memory.store import StoredMessage
from bot.memory.summary import CHAPTER_PROMPT, FOLD_INPUT_TOKENS, _fold_input

OLD_PROMPT = (
    "You summarize one stretch of a chat between a person and an assistant, as a chapter "
    "that follows the earlier ones. In at most {words} words keep names, dates, decisions, "
    "preferences and open questions; drop small talk and anything the earlier chapters "
    "already say. Write plain sentences, no preamble."
)
WORDS = 60  # summary.max_tokens 200 x CHAPTER_WORDS_SHARE 0.3
MONTHS = set(
    [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ]
)
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'-]+|\d[\d.,:/]*")


def facts(text: str) -> set[str]:
    out: set[str] = set()
    words = _TOKEN.findall(text)
    for i, w in enumerate(words):
        low = w.lower()
        if w[0].isdigit() or low in MONTHS or (i > 0 and w[0].isupper() and len(w) > 2):
            out.add(low.rstrip(".,"))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.summary_facts")
    p.add_argument("data", type=Path)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--conversations", type=int, default=2)
    p.add_argument("--blocks", type=int, default=3)
    args = p.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key="x", timeout=600)
    counter = make_counter()
    scores: dict[str, list[float]] = {"before": [], "now": []}
    for dlg in load(args.data)[: args.conversations]:
        turns = dlg.turns
        start = 0
        for _ in range(args.blocks):
            used, end = 0, start
            while end < len(turns) and used < FOLD_INPUT_TOKENS:
                used += counter.count(turns[end].text)
                end += 1
            block = turns[start:end]
            ids = {t.dia_id for t in block}
            wanted: set[str] = set()
            for q in dlg.questions:
                if q.category <= 4 and any(e in ids for e in q.evidence):
                    for e in q.evidence:
                        if e in ids:
                            wanted |= facts(next(t.text for t in block if t.dia_id == e))
            msgs = [
                StoredMessage(i, 0, "user", t.speaker, t.text, t.created_at, 0, None, None, "")
                for i, t in enumerate(block)
            ]
            material = _fold_input("", msgs)
            for name, prompt in (("before", OLD_PROMPT), ("now", CHAPTER_PROMPT)):
                out = client.chat.completions.create(
                    model=args.model,
                    messages=[
                        {"role": "system", "content": prompt.format(words=WORDS)},
                        {"role": "user", "content": material},
                    ],
                    max_tokens=200,
                    temperature=0,
                )
                text = (out.choices[0].message.content or "").lower()
                kept = sum(1 for f in wanted if f in text)
                share = kept / len(wanted) if wanted else 0.0
                if wanted:
                    scores[name].append(share)
                print(f"{dlg.sample_id} turns {start}-{end}: {name}: {kept}/{len(wanted)} facts "
                      f"kept, {counter.count(text)} tokens", flush=True)  # fmt: skip
            start = end
    for name, values in scores.items():
        if values:
            print(f"{name}: mean share of evidence facts kept {statistics.mean(values):.3f} "
                  f"over {len(values)} chapters")  # fmt: skip


if __name__ == "__main__":
    main()
