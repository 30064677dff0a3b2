"""Retrieval: query building, scoping, ranking, the threshold, packing, and a planted fact.

The synthetic conversation here is written for these tests (not LoCoMo): a person mentions a
fact once, then talks about other things for hundreds of turns.
"""

from __future__ import annotations

import logging
import math
import random

import pytest

from bot.config import EmbeddingsConfig, Endpoint, RetrievalConfig
from bot.domain import ConversationKey
from bot.llm.tokens import make_counter
from bot.memory.embeddings import OpenAICompatEmbedder
from bot.memory.indexer import Indexer
from bot.memory.ranking import Outline, bm25_rank, partners
from bot.memory.retrieval import Retriever, is_repeat, query_terms
from bot.memory.store import ASSISTANT, USER, SqliteStore
from tests.fakes.fake_llm import FakeLLM

COUNTER = make_counter()
ALICE = ConversationKey("mesh", "!a11ce000")
BOB = ConversationKey("mesh", "!b0b00000")
DAY = 86_400.0
START = 1_700_000_000.0  # 14 Nov 2023

TOPICS = [
    ("did the rain stop over at the ridge?", "Radar shows showers until the evening."),
    ("my solar panel only gives 3 watts today", "Cloud cover cuts output; tilt it south."),
    ("which antenna is better for hills, a yagi or an omni?", "An omni covers more paths."),
    ("we hiked eight miles to the fire tower", "Sounds like a long and good walk."),
    ("the battery on node two drains overnight", "Check the screen timeout and GPS polling."),
    ("any tips for cooking rice on a camp stove?", "Use a lid and low flame after the boil."),
    ("traffic on the bridge was awful this morning", "Roadworks usually end by noon."),
    ("what channel do the club members use?", "LongFast on the default channel, mostly."),
]


async def _conversation(
    store: SqliteStore, key: ConversationKey, turns: list[tuple[str, str]], *, start: float = START
) -> list[int]:
    conv = await store.conversation(key)
    ids = []
    for i, (role, text) in enumerate(turns):
        ids.append(
            await store.add_message(
                conv.id,
                role=role,
                author=key.person if role == USER else "meshsage",
                text=text,
                tokens=COUNTER.count(text),
                status="answered",
                created_at=start + i * 600.0,
            )
        )
    return ids


def _filler(n: int, seed: int = 7) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for _ in range(n):
        q, a = rng.choice(TOPICS)
        out += [(USER, q), (ASSISTANT, a)]
    return out


def _retriever(store: SqliteStore, **overrides: object) -> Retriever:
    return Retriever(store=store, counter=COUNTER, config=RetrievalConfig(**overrides))


# --- query building -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('what is "the" name of my dog?', ["name", "dog"]),
        ("NEAR(radio antenna) OR body:yagi*", ["near", "radio", "antenna", "body", "yagi"]),
        ("It's Rex's bowl", ["rexs", "bowl"]),
        ("what is it that you were to me?", []),
        ("Zürich, 東京 and café", ["zürich", "東京", "café"]),
        ("", []),
    ],
)
def test_query_terms(text: str, expected: list[str]) -> None:
    assert query_terms(text) == expected


@pytest.mark.parametrize(
    "text",
    ['say "hi', "a*", "NEAR(a b", "x OR", "body:dog", "meta:2023", "^start", "(dog", "-dog",
     "dog AND NOT cat", "'; DROP TABLE messages; --", "\x00nul", "{body meta}: dog"],
)  # fmt: skip
async def test_fts5_syntax_in_messages_is_plain_text(store: SqliteStore, text: str) -> None:
    said = f"my dog likes {text}, and long walks by the river"  # more than a repeat of the query
    ids = await _conversation(store, ALICE, [(USER, said), (ASSISTANT, "ok")])
    conv = await store.conversation(ALICE)
    block = await _retriever(store).retrieve(
        conv, f"dog {text}", budget_tokens=200, before_id=ids[-1] + 1
    )
    assert ids[0] in [m.id for m in block.turns]


async def test_stopword_only_message_retrieves_nothing(store: SqliteStore) -> None:
    ids = await _conversation(store, ALICE, [(USER, "what is it?"), (ASSISTANT, "it is what")])
    conv = await store.conversation(ALICE)
    block = await _retriever(store).retrieve(
        conv, "what is it that you were?", budget_tokens=500, before_id=ids[-1] + 1
    )
    assert block.turns == [] and block.text == ""


# --- scoping and the threshold --------------------------------------------------------------
async def test_another_persons_turns_are_never_retrieved(store: SqliteStore) -> None:
    bob = await _conversation(store, BOB, [(USER, "my kayak is called Heron"), (ASSISTANT, "ok")])
    alice = await _conversation(store, ALICE, _filler(20))
    conv = await store.conversation(ALICE)
    block = await _retriever(store, min_score=0.0).retrieve(
        conv, "what is my kayak called? Heron?", budget_tokens=2000, before_id=10**9
    )
    assert not set(bob) & {m.id for m in block.turns}
    assert {m.id for m in block.turns} <= set(alice)
    assert "Heron" not in block.text


async def test_reset_mark_and_window_bound_are_respected(store: SqliteStore) -> None:
    ids = await _conversation(store, ALICE, [(USER, "my kayak is called Heron"), *_filler(5)])
    conv = await store.conversation(ALICE)
    later = await _conversation(
        store, ALICE, [(USER, "kayak paddles are cheap")], start=START + DAY
    )
    assert (await _retriever(store).retrieve(
        conv, "kayak", budget_tokens=500, before_id=later[0])).turns[0].id == ids[0]  # fmt: skip
    await store.reset(conv.id)
    conv = await store.conversation(ALICE)
    block = await _retriever(store).retrieve(conv, "kayak", budget_tokens=500, before_id=10**9)
    assert block.turns == []  # everything was before the reset mark


async def test_unrelated_question_retrieves_nothing(store: SqliteStore) -> None:
    ids = await _conversation(store, ALICE, _filler(200))
    conv = await store.conversation(ALICE)
    retriever = _retriever(store)
    # "today" is in the history, but "capital" and "france" never were: no turn matches enough.
    block = await retriever.retrieve(
        conv, "what is the capital of France today?", budget_tokens=1000, before_id=ids[-1] + 1
    )
    assert block.turns == []
    # Without the threshold the same question drags in turns that only share "today".
    loose = await _retriever(store, min_score=0.0).retrieve(
        conv, "what is the capital of France today?", budget_tokens=1000, before_id=ids[-1] + 1
    )
    assert loose.turns and all("today" in m.text for m in loose.turns if m.role == USER)


# --- the planted fact -----------------------------------------------------------------------
async def test_planted_fact_is_retrieved_at_256_tokens(store: SqliteStore) -> None:
    before = _filler(150, seed=1)
    planted = [
        (USER, "guess what we brought home from the shelter on saturday"),
        (ASSISTANT, "A puppy?"),
        (USER, "yes! a beagle, we named him Biscuit"),
        (ASSISTANT, "Biscuit is a great name for a beagle."),
    ]
    after = _filler(150, seed=2)
    ids = await _conversation(store, ALICE, before + planted + after)
    await _conversation(store, BOB, [(USER, "my puppy is a poodle named Biscuit")] * 50)
    conv = await store.conversation(ALICE)
    block = await _retriever(store).retrieve(
        conv, "what was the name of my puppy again?", budget_tokens=256, before_id=ids[-1] + 1
    )
    texts = [m.text for m in block.turns]
    # "puppy" is only in the bot's question; the name is in the next turn, which borrows its
    # neighbour's score.
    assert "yes! a beagle, we named him Biscuit" in texts
    assert block.tokens <= 256
    assert "[" in block.lines[0] and "Nov 2023" in block.lines[0]  # dated
    assert block.text.count("\n") + 1 == len(block.lines)


async def test_block_is_chronological_dated_and_within_budget(store: SqliteStore) -> None:
    turns = []
    for day in range(6):
        turns += [(USER, f"day {day}: the battery on node {day} drains"), (ASSISTANT, "Check GPS.")]
    ids: list[int] = []
    for day in range(6):
        ids += await _conversation(
            store, ALICE, turns[2 * day : 2 * day + 2], start=START + day * DAY
        )
    conv = await store.conversation(ALICE)
    retriever = _retriever(store)
    for budget in range(0, 200, 7):
        block = await retriever.retrieve(
            conv, "battery drains", budget_tokens=budget, before_id=ids[-1] + 1
        )
        assert sum(COUNTER.count(line) + 1 for line in block.lines) <= max(budget, 0)
        assert block.tokens <= budget
        assert [m.id for m in block.turns] == sorted(m.id for m in block.turns)
        dates = [line for line in block.lines if line.startswith("[")]
        assert len(dates) == len(set(dates))  # one date line per day
        for msg in block.turns:
            assert msg.text in block.text  # whole turns only


# --- ranking (pure) -------------------------------------------------------------------------
def test_neighbour_borrowing_lifts_the_answer_next_to_a_match() -> None:
    outline = Outline([(i, USER if i % 2 else ASSISTANT, 10) for i in range(1, 21)])
    postings = [[5], [5, 12]]  # turn 5 matches both words, turn 12 one
    ranked = bm25_rank(outline, postings, k1=1.2, b=0.4, neighbour=0.6, min_share=0.0)
    order = [r.id for r in ranked]
    assert order[0] == 5
    assert order.index(4) < order.index(3) and order.index(6) < order.index(7)
    assert {4, 6} < set(order[:5])  # the neighbours of the best match outrank weaker far turns
    top = bm25_rank(outline, postings, k1=1.2, b=0.4, neighbour=0.6, min_share=0.0, limit=3)
    assert top == ranked[:3]
    flat = bm25_rank(outline, postings, k1=1.2, b=0.4, neighbour=0.0, min_share=0.0)
    assert [r.id for r in flat] == [5, 12]


def test_threshold_is_a_share_of_the_query_idf_mass() -> None:
    outline = Outline([(i, USER, 10) for i in range(1, 101)])
    common = list(range(1, 60))
    rare_missing: list[int] = []  # a query word this person never used
    ranked = bm25_rank(outline, [common, rare_missing], k1=1.2, b=0.4, neighbour=0.0,
                       min_share=0.15)  # fmt: skip
    assert ranked == []
    ranked = bm25_rank(outline, [common], k1=1.2, b=0.4, neighbour=0.0, min_share=0.15)
    assert len(ranked) == len(common)


def test_idf_and_length_normalisation() -> None:
    outline = Outline([(1, USER, 5), (2, USER, 50), (3, USER, 5), (4, USER, 5)])
    ranked = bm25_rank(outline, [[1, 2], [3, 4, 1, 2]], k1=1.2, b=0.75, neighbour=0.0,
                       min_share=0.0)  # fmt: skip
    scores = {r.id: r.score for r in ranked}
    assert scores[1] > scores[2]  # same words, shorter turn
    assert scores[1] > scores[3]  # the rarer word counts more
    # Exactly BM25 with binary tf, as a share of the query's IDF mass (neighbour 0).
    idf_rare = math.log(1 + (4 - 2 + 0.5) / (2 + 0.5))
    idf_common = math.log(1 + (4 - 4 + 0.5) / (4 + 0.5))
    avgdl = (5 + 50 + 5 + 5) / 4
    norm_short = 2.2 / (1 + 1.2 * (1 - 0.75 + 0.75 * 5 / avgdl))
    possible = idf_rare + idf_common
    assert scores[3] == pytest.approx(idf_common * norm_short / possible)
    assert scores[1] == pytest.approx((idf_rare + idf_common) * norm_short / possible)


def test_partners_pair_questions_with_answers() -> None:
    outline = Outline(
        [(1, USER, 1), (2, ASSISTANT, 1), (3, USER, 1), (4, USER, 1), (5, ASSISTANT, 1)]
    )
    assert partners(outline, [1]) == [2]  # a question -> its answer
    assert partners(outline, [5]) == [4]  # an answer -> its question
    assert partners(outline, [1, 2]) == []  # already together
    assert partners(outline, [3]) == []  # no answer follows it
    assert partners(outline, [2, 4]) == [1, 5]
    assert partners(outline, [2, 4], span=(1, 4)) == []  # never outside the searched range


async def test_partner_fills_leftover_budget_after_ranked_hits(store: SqliteStore) -> None:
    ids = await _conversation(
        store,
        ALICE,
        [
            (USER, "where should the repeater go?"),
            (ASSISTANT, "On the water tower roof."),
            *_filler(40),
        ],
    )
    conv = await store.conversation(ALICE)
    # neighbour 0: only the question matches; the answer comes in as its partner.
    block = await _retriever(store, neighbour=0.0).retrieve(
        conv, "repeater placement", budget_tokens=500, before_id=ids[-1] + 1
    )
    assert [m.id for m in block.turns] == ids[:2]
    tight = await _retriever(store, neighbour=0.0).retrieve(
        conv, "repeater placement",
        budget_tokens=sum(COUNTER.count(line) + 1 for line in block.lines[:2]),
        before_id=ids[-1] + 1,
    )  # fmt: skip
    assert [m.id for m in tight.turns] == ids[:1]  # never at the expense of the ranked hit


async def test_outline_cache_follows_new_and_deleted_messages(store: SqliteStore) -> None:
    await _conversation(store, BOB, [(USER, "bob's kayak")])
    ids = await _conversation(store, ALICE, [(USER, "my kayak is red"), (ASSISTANT, "nice")])
    conv = await store.conversation(ALICE)
    retriever = _retriever(store)
    assert list((await retriever.outline(conv.id)).ids) == ids
    more = await _conversation(store, ALICE, [(USER, "the kayak leaks")], start=START + DAY)
    assert list((await retriever.outline(conv.id)).ids) == ids + more  # grown, not rebuilt
    await store.prune_older_than(START + 1.0)  # retention deletes the first message
    assert list((await retriever.outline(conv.id)).ids) == ids[1:] + more
    block = await retriever.retrieve(conv, "kayak", budget_tokens=500, before_id=10**9)
    assert [m.id for m in block.turns] == [ids[1], *more]


# --- hybrid: vectors from the fake server's /v1/embeddings over HTTP --------------------------
def _embedder(fake_llm: FakeLLM) -> OpenAICompatEmbedder:
    config = EmbeddingsConfig.model_validate({"enabled": True, "model": "fake-embed"})
    return OpenAICompatEmbedder(config=config, llm=Endpoint(base_url=fake_llm.base_url), env={})


async def test_vectors_find_a_turn_that_shares_no_searchable_word(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    # Only stopwords: FTS5 has nothing to look up, the (bag-of-words) vectors still match.
    ids = await _conversation(
        store, ALICE, [*_filler(30), (USER, "were you there when it was over?"), *_filler(30)]
    )
    conv = await store.conversation(ALICE)
    embedder = _embedder(fake_llm)
    try:
        await Indexer(store=store, embedder=embedder, batch=16).index_conversation(conv.id)
        hybrid = Retriever(
            store=store, counter=COUNTER, config=RetrievalConfig(), embedder=embedder
        )
        block = await hybrid.retrieve(
            conv, "so when it was over, were you there?", budget_tokens=200, before_id=10**9
        )
        assert "were you there when it was over?" in [m.text for m in block.turns]
        words_only = await _retriever(store).retrieve(
            conv, "so when it was over, were you there?", budget_tokens=200, before_id=10**9
        )
        assert words_only.turns == []
        assert ids[60] in [m.id for m in block.turns]
    finally:
        await embedder.close()


async def test_embedding_server_down_falls_back_to_words(
    store: SqliteStore, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await _conversation(store, ALICE, [(USER, "my kayak is called Heron"), *_filler(20)])
    conv = await store.conversation(ALICE)
    embedder = _embedder(fake_llm)
    port = fake_llm.port
    try:
        await Indexer(store=store, embedder=embedder, batch=16).index_conversation(conv.id)
        hybrid = Retriever(
            store=store, counter=COUNTER, config=RetrievalConfig(), embedder=embedder
        )
        await fake_llm.stop()
        caplog.set_level(logging.INFO, logger="bot.memory.retrieval")
        for _ in range(3):
            block = await hybrid.retrieve(conv, "kayak name?", budget_tokens=200, before_id=10**9)
            assert block.turns[0].id == ids[0]
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "words only" in warnings[0].getMessage()
        await fake_llm.start(port=port)
        before = len(fake_llm.embed_requests)
        block = await hybrid.retrieve(conv, "kayak name?", budget_tokens=200, before_id=10**9)
        assert block.turns[0].id == ids[0]
        assert len(fake_llm.embed_requests) == before + 1  # the query was embedded again
        assert any("embeddings again" in r.getMessage() for r in caplog.records)
    finally:
        await embedder.close()


async def test_outline_cache_is_bounded_by_messages_not_only_conversations(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's RSS grew with every message: each cached outline grows with its conversation,
    so the cache is bounded by the messages it holds, newest conversations kept."""
    import bot.memory.retrieval as retrieval

    monkeypatch.setattr(retrieval, "OUTLINE_CACHE_MESSAGES", 5)
    retriever = _retriever(store)
    people = [ConversationKey("mesh", f"!p{i}") for i in range(3)]
    for key in people:
        await _conversation(store, key, [(USER, "one"), (ASSISTANT, "two"), (USER, "three")])
        await retriever.outline((await store.conversation(key)).id)
    cached = retriever._outlines
    assert sum(len(o) for o in cached.values()) <= 5
    assert list(cached) == [(await store.conversation(people[-1])).id]  # the newest stays


# --- repeats and complete matches (issue 17) ------------------------------------------------
def test_a_repeat_says_the_same_words_not_merely_some_of_them() -> None:
    terms = query_terms("How is the weather looking for tomorrow around here? (12)")
    assert is_repeat("How is the weather looking for tomorrow around here? (7)", terms)
    assert is_repeat("good morning!", query_terms("Good morning"))
    assert not is_repeat("my dog likes walks by the river", query_terms("dog walks"))
    assert not is_repeat("The weather was awful on the hike", terms)
    assert not is_repeat("", terms) and not is_repeat("anything", [])


async def test_a_repeated_message_and_its_answers_are_not_recalled_nor_a_match(
    store: SqliteStore,
) -> None:
    phrase = "anyone hearing the repeater on channel five tonight"
    turns = [(USER, "my boat Osprey is moored at the north pier"), (ASSISTANT, "noted")]
    turns += [(USER, phrase), (ASSISTANT, f"{phrase}? loud and clear")] * 6
    ids = await _conversation(store, ALICE, turns)
    conv = await store.conversation(ALICE)
    retriever = _retriever(store)
    ranked, _outline, _span = await retriever.rank(conv, phrase, before_id=ids[-1] + 1)
    assert ranked == []  # every match was a repeat or an answer to one
    block = await retriever.retrieve(conv, phrase, budget_tokens=500, before_id=ids[-1] + 1)
    assert block.turns == []
    block = await retriever.retrieve(
        conv, "where is Osprey moored?", budget_tokens=500, before_id=ids[-1] + 1
    )
    assert ids[0] in [m.id for m in block.turns]


async def test_after_a_complete_match_only_turns_near_its_score_come(store: SqliteStore) -> None:
    turns = [(USER, "my sister Ingrid lives in Bergen"), (ASSISTANT, "nice city")]
    turns += _filler(10)
    turns += [(USER, f"Ingrid called me about the ferry ({i})") for i in range(4)]
    ids = await _conversation(store, ALICE, turns)
    conv = await store.conversation(ALICE)
    retriever = _retriever(store)
    ranked, _outline, _span = await retriever.rank(
        conv, "where does my sister live?", before_id=ids[-1] + 1
    )
    assert ranked[0].id == ids[0] and ranked[0].words == pytest.approx(1.0)
    wide = await retriever.retrieve(
        conv, "where does my sister Ingrid live?", budget_tokens=800, before_id=ids[-1] + 1
    )
    sure = await retriever.retrieve(
        conv,
        "where does my sister Ingrid live?",
        budget_tokens=800,
        before_id=ids[-1] + 1,
        relative=0.7,
    )
    assert ids[0] in [m.id for m in sure.turns]
    assert len(sure.turns) < len(wide.turns)  # the other Ingrid turns score far below
    # A partial match (no turn holds "ferry" and "Bergen" together) keeps the wide net.
    partial = await retriever.retrieve(
        conv, "Bergen ferry", budget_tokens=800, before_id=ids[-1] + 1, relative=0.7
    )
    wide_partial = await retriever.retrieve(
        conv, "Bergen ferry", budget_tokens=800, before_id=ids[-1] + 1
    )
    assert [m.id for m in partial.turns] == [m.id for m in wide_partial.turns]


async def test_spare_room_after_a_complete_match_takes_turns_that_match_themselves(
    store: SqliteStore,
) -> None:
    """Room a short window left (``spare_tokens``) goes, after a complete match's cut, to the
    next-best turns holding enough of the query's words themselves, after the cut's turns;
    turns that only borrow a neighbour's score stay out, and the block's ``core`` (what a
    recall note may keep) is the cut's turns only. A weak match gets only such turns."""
    turns = [(USER, "my sister Ingrid lives in Bergen"), (ASSISTANT, "nice city")]
    turns += _filler(10)
    turns += [(USER, f"Ingrid called me about the ferry ({i})") for i in range(4)]
    turns += _filler(10)
    ids = await _conversation(store, ALICE, turns)
    conv = await store.conversation(ALICE)
    retriever = _retriever(store)
    query = "where does my sister Ingrid live?"
    before = ids[-1] + 1
    sure = await retriever.retrieve(conv, query, budget_tokens=800, before_id=before, relative=0.7)
    filled = await retriever.retrieve(
        conv, query, budget_tokens=800, before_id=before, relative=0.7, spare_tokens=400
    )
    ferry = {i for i, (_role, text) in zip(ids, turns, strict=True) if "ferry" in text}
    assert not ferry & {m.id for m in sure.turns}  # under the cut
    assert ferry <= {m.id for m in filled.turns}  # the spare room takes them ("Ingrid")
    assert [m.id for m in filled.order[: filled.core]] == [m.id for m in sure.order]
    assert all("Ingrid" in m.text for m in filled.order[filled.core :] if m.role == USER)
    assert filled.tokens <= 800 + 400
    # A weak match (weight 0 within the budget) recalls nothing without spare room, and only
    # turns that hold its words themselves with it.
    weak = await retriever.retrieve(
        conv, "ferry", budget_tokens=800, before_id=before, weight=lambda _s: 0.0
    )
    assert weak.turns == []
    weak_filled = await retriever.retrieve(
        conv, "ferry", budget_tokens=800, before_id=before, weight=lambda _s: 0.0, spare_tokens=400
    )
    assert {m.id for m in weak_filled.turns if m.role == USER} == ferry
