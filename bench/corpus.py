"""Synthetic chat history for the pipeline benchmark: a seeded generator and a bulk loader.

What it owns:
- ``TextGen``: English-ish text from a few-thousand-word vocabulary with Zipf-like word
  frequencies (real function words on top, a couple of hundred real chat words, then
  syllable-built words), sentences and messages of varied length. Same seed, same text.
- ``generate_database``: a database of N messages over C conversations, created through the
  real migrations (``SqliteStore.open``) so the schema, indexes and FTS triggers are the ones
  the bot runs with; rows are then bulk-inserted with plain ``sqlite3`` in large transactions.

Invariants:
- Messages are inserted in global time order, interleaving conversations as a real bot's log
  does, so one conversation's rows are scattered over the table (a full-conversation load pays
  for that scatter, as it would in production).
- Conversations alternate user/assistant and end with an answer; conversation sizes are skewed
  (log-normal: most are short, a few have thousands of messages); timestamps spread over
  ``SPAN_DAYS`` before a fixed end time.
- Each longer conversation gets one rolling-summary row covering all but its last
  ``SUMMARY_TAIL`` messages, and some get pinned facts, so the bot starts in its steady state.
- Token counts are the bot's own counter's, exactly as the responder would store them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bot.llm.tokens import TokenCounter, make_counter
from bot.memory.store import SqliteStore

GENERATOR_VERSION = 1  # bump when the output changes, so cached databases are rebuilt
TRANSPORT = "bench"
BOT_NAME = "meshsage"
END_TIME = 1_748_736_000.0  # 2025-06-01 UTC: fixed, so the same seed gives the same file
SPAN_DAYS = 180
SUMMARY_TAIL = 24
SUMMARY_MIN_MESSAGES = 40
INSERT_BATCH = 50_000

FUNCTION_WORDS = """the i to you and a it is of that in my what do for me on have be this
was with but not can so are your how just we if at about like there or know will all would
they get one when an out up think no from yes as some time more been had any now did go
could then good well because really should here want need also much going still very day
where he she her his them their who which thing things make see got over only by way why
does after back first than too even right today last next something maybe sure new long
little same try again around before never always other into""".split()  # noqa: SIM905

CHAT_WORDS = """radio antenna battery node mesh channel message signal range weather rain
garden dinner meeting trip train car bike road hill river lake forest camp tent fire water
coffee tea breakfast lunch book movie music song guitar piano game match team school work
office project report email phone laptop code bug server update install network router
power solar panel charger cable firmware device screen keyboard friend family mother father
sister brother kids dog cat bird birthday party holiday weekend morning evening night week
month year summer winter spring autumn snow wind storm cloud sun moon star map trail mountain
city town village street house kitchen bedroom window door roof wall floor table chair bed
doctor hospital medicine sleep health walk run swim climb cook bake bread soup pasta rice
chicken fish apple orange potato tomato cheese milk sugar salt recipe price money bank bill
shop market store order delivery package box letter card gift plan idea question answer
problem reason story news paper article class lesson test exam grade teacher student homework
language english spanish french german word name number address ticket flight hotel airport
bus station bridge boat beach island""".split()  # noqa: SIM905

_ONSETS = "b br c ch cl d dr f fl g gr h j k l m n p pl pr r s sh sl st t th tr v w".split()  # noqa: SIM905
_VOWELS = "a e i o u ai ea ee oo ou".split()  # noqa: SIM905
_CODAS = ["", "", "n", "r", "st", "nd", "ll", "ck", "t", "m", "sh", "ng"]
_SUFFIXES = ["", "", "", "s", "ing", "ed", "er", "ly", "tion"]


class TextGen:
    """Seeded English-ish text. Word frequencies follow a Zipf-Mandelbrot law over rank."""

    def __init__(self, *, seed: int, vocab_size: int = 4000) -> None:
        rng = random.Random(seed)
        words: list[str] = list(dict.fromkeys(FUNCTION_WORDS))
        chat = list(dict.fromkeys(CHAT_WORDS))
        rng.shuffle(chat)
        words += [w for w in chat if w not in words]
        seen = set(words)
        while len(words) < vocab_size:
            word = "".join(
                rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                for _ in range(rng.choice((1, 1, 1, 2, 2, 3)))
            ) + rng.choice(_SUFFIXES)
            if word not in seen and len(word) > 2:
                seen.add(word)
                words.append(word)
        self.words = words
        self._cum = list(itertools.accumulate(1.0 / (rank + 2.7) for rank in range(len(words))))

    def sentence(self, rng: random.Random, *, question: bool = False) -> str:
        n = max(2, min(40, round(rng.lognormvariate(math.log(9), 0.5))))
        picked = rng.choices(self.words, cum_weights=self._cum, k=n)
        if rng.random() < 0.15:
            picked.insert(rng.randrange(len(picked)), str(rng.randint(1, 2030)))
        if rng.random() < 0.2:
            i = rng.randrange(len(picked))
            picked[i] = picked[i].capitalize()  # a name or place
        if n > 8 and rng.random() < 0.4:
            picked[n // 2] += ","
        text = " ".join(picked)
        return text[0].upper() + text[1:] + ("?" if question else rng.choice(".....!"))

    def user_message(self, rng: random.Random) -> str:
        count = rng.choice((1, 1, 1, 2, 2, 3))
        parts = [self.sentence(rng) for _ in range(count - 1)]
        parts.append(self.sentence(rng, question=rng.random() < 0.6))
        return " ".join(parts)

    def assistant_message(self, rng: random.Random) -> str:
        count = rng.randint(8, 16) if rng.random() < 0.1 else rng.randint(1, 5)
        return " ".join(self.sentence(rng) for _ in range(count))

    def summary(self, rng: random.Random) -> str:
        return " ".join(self.sentence(rng) for _ in range(rng.randint(6, 10)))


@dataclass(frozen=True, slots=True)
class GenStats:
    messages: int
    conversations: int
    summaries: int
    facts: int
    seconds: float
    file_bytes: int


def person_id(index: int) -> str:
    return f"!{index * 2654435761 % (1 << 32):08x}"  # mesh-style node ids, distinct per index


def conversation_sizes(rng: random.Random, *, messages: int, conversations: int) -> list[int]:
    """Even sizes (whole turns), skewed log-normally, summing to ``messages``."""
    if messages < 2 * conversations:
        raise ValueError("need at least one turn (2 messages) per conversation")
    raw = [rng.lognormvariate(0.0, 1.2) for _ in range(conversations)]
    scale = (messages / 2 - conversations) / sum(raw)
    turns = [1 + int(r * scale) for r in raw]
    short = messages // 2 - sum(turns)
    for i in rng.sample(range(conversations), k=short) if short <= conversations else []:
        turns[i] += 1
    while sum(turns) < messages // 2:  # tiny inputs: spread what rounding left over
        turns[rng.randrange(conversations)] += 1
    return [2 * t for t in turns]


def _conversation_stream(
    conv_id: int, size: int, rng: random.Random
) -> Iterator[tuple[float, int, int]]:
    """(created_at, conversation id, position) in time order for one conversation."""
    start = END_TIME - rng.uniform(1, SPAN_DAYS) * 86_400
    times = sorted(rng.uniform(start, END_TIME - 120) for _ in range(size // 2))
    for turn, t in enumerate(times):
        yield t, conv_id, 2 * turn
        yield t + rng.uniform(2, 30), conv_id, 2 * turn + 1


def generate_database(
    path: Path, *, messages: int, conversations: int, seed: int, quiet: bool = False
) -> GenStats:
    """Create ``path`` (must not exist) with the bot's schema and a synthetic history."""
    started = time.perf_counter()
    if path.exists():
        raise FileExistsError(f"{path} exists; remove it or pick another path")
    asyncio.run(_migrate(path))
    counter = make_counter()
    gen = TextGen(seed=seed)
    rng = random.Random(seed + 1)
    sizes = conversation_sizes(rng, messages=messages, conversations=conversations)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA synchronous = OFF")  # generation only; the bot runs with NORMAL
        db.execute("PRAGMA cache_size = -262144")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO conversations (id, transport, person, space, created_at)"
            " VALUES (?, ?, ?, 'dm', ?)",
            [
                (cid, TRANSPORT, person_id(cid), END_TIME - SPAN_DAYS * 86_400)
                for cid in range(1, conversations + 1)
            ],
        )
        db.execute("COMMIT")
        streams = [
            _conversation_stream(cid, size, random.Random(f"{seed}:{cid}"))
            for cid, size in enumerate(sizes, start=1)
        ]
        ids: dict[int, list[int]] = {cid: [] for cid in range(1, conversations + 1)}
        batch: list[tuple[object, ...]] = []
        next_id = 1
        text_rng = random.Random(seed + 2)
        for created, cid, pos in heapq.merge(*streams):
            user = pos % 2 == 0
            text = gen.user_message(text_rng) if user else gen.assistant_message(text_rng)
            batch.append(
                (
                    next_id,
                    cid,
                    "user" if user else "assistant",
                    f"Person {cid}" if user else BOT_NAME,
                    text,
                    created,
                    counter.count(text),
                    None if user else next_id - 1,
                    "answered" if user else "sent",
                )
            )
            ids[cid].append(next_id)
            next_id += 1
            if len(batch) >= INSERT_BATCH:
                _insert(db, batch)
                batch.clear()
                if not quiet:
                    print(f"  {next_id - 1:,} messages", end="\r", file=sys.stderr, flush=True)
        _insert(db, batch)
        n_summaries, n_facts = _derived(db, gen, counter, ids, random.Random(seed + 3))
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    asyncio.run(_optimize(path))  # what every bot shutdown runs (PRAGMA optimize)
    if not quiet:
        print(file=sys.stderr)
    return GenStats(
        messages=next_id - 1,
        conversations=conversations,
        summaries=n_summaries,
        facts=n_facts,
        seconds=time.perf_counter() - started,
        file_bytes=path.stat().st_size,
    )


def _insert(db: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO messages (id, conversation_id, role, author, text, created_at, tokens,"
        " parent_id, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    db.execute("COMMIT")


def _derived(
    db: sqlite3.Connection,
    gen: TextGen,
    counter: TokenCounter,
    ids: dict[int, list[int]],
    rng: random.Random,
) -> tuple[int, int]:
    """One summary per long conversation (steady state) and pinned facts for some."""
    summaries: list[tuple[object, ...]] = []
    facts: list[tuple[object, ...]] = []
    for cid, mids in ids.items():
        if len(mids) >= SUMMARY_MIN_MESSAGES:
            text = gen.summary(rng)
            summaries.append(
                (cid, text, mids[0], mids[-SUMMARY_TAIL - 1], counter.count(text), END_TIME)
            )
        if rng.random() < 0.3:
            for _ in range(rng.randint(1, 4)):
                text = gen.sentence(rng)
                facts.append((cid, text, counter.count(text), END_TIME))
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO summaries (conversation_id, text, first_message_id, last_message_id,"
        " tokens, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        summaries,
    )
    db.executemany(
        "INSERT INTO facts (conversation_id, text, tokens, created_at) VALUES (?, ?, ?, ?)",
        facts,
    )
    db.execute("COMMIT")
    return len(summaries), len(facts)


async def _migrate(path: Path) -> None:
    store = await SqliteStore.open(path)
    await store.close()


async def _optimize(path: Path) -> None:
    store = await SqliteStore.open(path)
    await store.close()
