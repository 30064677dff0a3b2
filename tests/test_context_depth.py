"""``memory.retrieval.context_depth`` (issue 42): how many turns on each side of a hit are
candidates and lend it score, read from the config by the real ``Retriever`` over a real
SQLite store. The default (2) is what ranking did before it was a setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.config import RetrievalConfig, load_config
from bot.memory.ranking import NEIGHBOUR_REACH
from bot.memory.retrieval import Retriever
from bot.memory.store import ASSISTANT, USER, SqliteStore
from tests.test_retrieval import ALICE, COUNTER, _conversation, _filler

ROOT = Path(__file__).resolve().parents[1]


async def _ranked_ids(tmp_path: Path, **cfg: object) -> tuple[list[int], set[int]]:
    store = await SqliteStore.open(tmp_path / f"depth{cfg}.db")
    turns = _filler(20)
    turns[20:22] = [(USER, "my kayak is called Blue Heron"), (ASSISTANT, "A fine name.")]
    ids = await _conversation(store, ALICE, turns)
    conv = await store.conversation(ALICE)
    retriever = Retriever(store=store, counter=COUNTER, config=RetrievalConfig(**cfg))
    ranked, _outline, _span = await retriever.rank(conv, "what is my kayak called?",
                                                   before_id=10**9)  # fmt: skip
    await store.close()
    return ids, {r.id for r in ranked}


@pytest.mark.parametrize("depth", [0, 1, 2, 4])
async def test_context_depth_sets_how_many_neighbours_come_with_a_hit(
    tmp_path: Path, depth: int
) -> None:
    ids, got = await _ranked_ids(tmp_path, context_depth=depth)
    hit = 20  # the one turn with "kayak"
    assert got == {ids[i] for i in range(hit - depth, hit + depth + 1)}


async def test_context_depth_default_is_the_ranking_before_it_was_a_setting(
    tmp_path: Path,
) -> None:
    assert RetrievalConfig().context_depth == NEIGHBOUR_REACH == 2
    _, default = await _ranked_ids(tmp_path)
    _, two = await _ranked_ids(tmp_path, context_depth=2)
    assert default == two


def test_context_depth_is_validated_and_in_the_example_config() -> None:
    with pytest.raises(ValidationError, match="context_depth"):
        RetrievalConfig(context_depth=-1)
    with pytest.raises(ValidationError, match="context_depth"):
        RetrievalConfig(context_depth=11)
    example = load_config(str(ROOT / "config.example.yaml"), env={"OPENAI_API_KEY": "x"})
    assert example.memory.retrieval.context_depth == 2
