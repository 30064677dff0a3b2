"""Facts and chapters a real small model writes, through the bot's own code paths.

    python -m bench.facts_structured ../shared/bench/locomo-dev.json --base-url URL --model NAME
        [--conversations 2] [--blocks 3] [--modes structured,plain] [--no-chapters]
    [--block-tokens 1500]

For fold-sized blocks of each conversation (``bench.summary_facts``' blocks: the summarizer's
own input bound), the messages are stored in a fresh SQLite memory and read by the real
``FactExtractor`` through the real OpenAI-compatible adapter, once per mode: ``structured``
(the adapter sends ``bot.memory.facts.SCHEMA`` as the server's structured output, see
bot.llm.structured) and ``plain`` (the same call without it: free text, today's parsing).
Each block's messages are then folded by the real ``Summarizer`` (``CHAPTER_PROMPT``, then
``bot.memory.chapter_check``), unless ``--no-chapters``.

Reported per conversation and mode: facts kept (stored at the end), answers with no JSON
(the chunk left unread, then skipped), and the share of evidence words (numbers, names,
months of the turns the dev questions cite, as in ``bench.summary_facts``) found in the kept
facts; per chapter: whether the model's text passed the check or a digest replaced it, and
the evidence share of what was stored. Nothing is timed (speeds here vary 10x).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.recall import load
from bench.summary_facts import facts as evidence_words
from bot.config import LLMConfig, SummaryConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import LLM, ChatMessage, Completion, JsonSchema, OnText
from bot.llm.tokens import make_counter
from bot.memory import chapter_check
from bot.memory.chapter_text import FOLD_INPUT_TOKENS
from bot.memory.facts import FactExtractor
from bot.memory.store import SqliteStore
from bot.memory.summary import Summarizer


class WithoutSchema:
    """The LLM port with the schema dropped: what a server without structured output gets."""

    def __init__(self, inner: LLM) -> None:
        self._inner = inner

    @property
    def model_name(self) -> str:
        return self._inner.model_name

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
        model: str | None = None,
    ) -> Completion:
        return await self._inner.complete(
            messages, max_tokens=max_tokens, on_text=on_text, model=model
        )


def blocks(turns: Sequence[Any], count: int, size: int) -> list[tuple[int, int]]:
    """(start, end) of the first ``count`` blocks of about ``size`` tokens."""
    counter = make_counter()
    out: list[tuple[int, int]] = []
    start = 0
    while len(out) < count and start < len(turns):
        used, end = 0, start
        while end < len(turns) and used < size:
            used += counter.count(turns[end].text)
            end += 1
        out.append((start, end))
        start = end
    return out


async def run_conversation(
    dlg: Any,
    *,
    llm: OpenAICompatLLM,
    mode: str,
    n_blocks: int,
    size: int,
    chapters: bool,
    tmp: Path,
) -> dict[str, Any]:
    counter = make_counter()
    store = await SqliteStore.open(tmp / f"{dlg.sample_id}-{mode}.db")
    model: LLM = llm if mode == "structured" else WithoutSchema(llm)
    extractor = FactExtractor(store=store, llm=model, counter=counter, max_facts=20)
    summarizer = Summarizer(store=store, llm=model, counter=counter,
                            config=SummaryConfig(min_evicted=2))  # fmt: skip
    key = ConversationKey("bench", dlg.sample_id)
    conv = await store.conversation(key)
    wanted: set[str] = set()
    unparsed = 0
    chapter_rows: list[tuple[bool, float]] = []
    try:
        for start, end in blocks(dlg.turns, n_blocks, size):
            block = dlg.turns[start:end]
            ids = {t.dia_id for t in block}
            block_wanted: set[str] = set()
            for q in dlg.questions:
                for e in q.evidence if q.category <= 4 else ():
                    if e in ids:
                        block_wanted |= evidence_words(next(t.text for t in block if t.dia_id == e))
            wanted |= block_wanted
            for t in block:
                await store.add_message(conv.id, role="user", author=t.speaker, text=t.text,
                                        tokens=counter.count(t.text), status="answered",
                                        created_at=t.created_at)  # fmt: skip
            stored = await store.all_messages(conv.id)
            new = stored[len(stored) - len(block) :]
            before = await store.facts_through(conv.id)
            await extractor.extract(conv.id, new)
            if await store.facts_through(conv.id) == before:
                unparsed += 1  # left unread: no JSON in the answer
            if chapters:
                conv = await store.conversation(key)
                await summarizer.refresh(conv, window_start_id=new[-1].id + 1)
                chapter = (await store.summaries(conv))[-1]
                got = sum(1 for w in block_wanted if w in chapter.text.lower())
                chapter_rows.append((not chapter.text.startswith(chapter_check.DIGEST_MARK),
                                     got / len(block_wanted) if block_wanted else 1.0))  # fmt: skip
        kept = await store.facts(conv.id)
        text = " ".join(f.text for f in kept).lower()
        found = sum(1 for w in wanted if w in text)
        return {"facts": len(kept), "unparsed": unparsed, "skipped": extractor.skipped,
                "evidence": found / len(wanted) if wanted else 0.0, "wanted": len(wanted),
                "chapters": chapter_rows, "texts": [f.text for f in kept]}  # fmt: skip
    finally:
        await store.close()


async def amain(args: argparse.Namespace) -> None:
    cfg = LLMConfig.model_validate({"base_url": args.base_url, "model": args.model,
                                    "retries": 1, "read_timeout": 600})  # fmt: skip
    llm = OpenAICompatLLM(config=cfg, env={})
    modes = args.modes.split(",")
    totals: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for dlg in load(args.data)[: args.conversations]:
                for mode in modes:
                    r = await run_conversation(dlg, llm=llm, mode=mode, n_blocks=args.blocks,
                                               size=args.block_tokens,
                                               chapters=not args.no_chapters and mode == modes[0],
                                               tmp=Path(tmp))  # fmt: skip
                    totals[mode].append(r)
                    print(f"{dlg.sample_id} {mode}: {r['facts']} facts kept, {r['unparsed']}/"
                          f"{args.blocks} answers without JSON ({r['skipped']} skipped), "
                          f"evidence words in facts {r['evidence']:.2f} of {r['wanted']}",
                          flush=True)  # fmt: skip
                    for text in r["texts"][:6]:
                        print(f"    fact: {text[:100]}")
                    for i, (passed, share) in enumerate(r["chapters"], 1):
                        print(f"    chapter {i}: {'model text kept' if passed else 'digest'}, "
                              f"evidence words {share:.2f}")  # fmt: skip
    finally:
        await llm.close()
    for mode, rows in totals.items():
        chapters = [c for r in rows for c in r["chapters"]]
        per_conversation = statistics.mean(r["facts"] for r in rows)
        line = (f"{mode}: facts kept per conversation {per_conversation:.1f}"
                f", answers without JSON {sum(r['unparsed'] for r in rows)}/"
                f"{args.blocks * len(rows)}, evidence words in facts "
                f"{statistics.mean(r['evidence'] for r in rows):.3f}")  # fmt: skip
        if chapters:
            line += (f"; chapters kept {sum(p for p, _ in chapters)}/{len(chapters)} (the rest "
                     f"digests), evidence words in stored chapters "
                     f"{statistics.mean(s for _, s in chapters):.3f}")  # fmt: skip
        print(line)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.facts_structured")
    p.add_argument("data", type=Path)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--conversations", type=int, default=2)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--modes", default="structured,plain")
    p.add_argument(
        "--block-tokens",
        type=int,
        default=FOLD_INPUT_TOKENS,
        help="block size (a fold reads up to FOLD_INPUT_TOKENS; smaller is faster)",
    )
    p.add_argument("--no-chapters", action="store_true")
    asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    main()
