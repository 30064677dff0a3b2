"""Embeddings end to end: the real openai client over HTTP to the fake server, a real SQLite file,
the indexer in the background of a running app, and `meshsage memory reindex` in a subprocess."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.config import EmbeddingsConfig, Endpoint, load_config
from bot.domain import ConversationKey
from bot.errors import EmbeddingUnavailable
from bot.memory.embeddings import OpenAICompatEmbedder
from bot.memory.indexer import Indexer, retry_delay
from bot.memory.store import SqliteStore
from tests.conftest import start_harness
from tests.fakes.fake_llm import EMBED_DIM, FakeLLM

SECRET = "zanzibar-omelette"
ENABLED = "memory:\n  embeddings:\n    enabled: true\n"
KEY = ConversationKey("console", "alice")


def _embedder(url: str, **kw: object) -> OpenAICompatEmbedder:
    config = EmbeddingsConfig.model_validate({"enabled": True, "model": "fake-embed", **kw})
    return OpenAICompatEmbedder(config=config, llm=Endpoint(base_url=url), env={})


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def _count(store: SqliteStore, table: str) -> int:
    return int((await store._all(f"SELECT count(*) FROM {table}"))[0][0])


# --- the adapter --------------------------------------------------------------------------------
async def test_embed_returns_unit_vectors_that_carry_meaning(fake_llm: FakeLLM) -> None:
    emb = _embedder(fake_llm.base_url, batch=2)
    try:
        texts = ["my antenna is a yagi", "which antenna is the yagi", "pizza for lunch today", "x"]
        vecs = await emb.embed(texts)
        assert len(vecs) == 4 and all(len(v) == EMBED_DIM for v in vecs)
        assert all(math.isclose(math.sqrt(_cos(v, v)), 1.0, rel_tol=1e-6) for v in vecs)
        assert _cos(vecs[0], vecs[1]) > 0.3 > _cos(vecs[0], vecs[2])
        assert [r["input"] for r in fake_llm.embed_requests] == [texts[:2], texts[2:]]  # batches
        assert fake_llm.embed_requests[0]["model"] == "fake-embed"
        assert await emb.embed([]) == [] and len(fake_llm.embed_requests) == 2
    finally:
        await emb.close()


async def test_server_down_is_a_domain_error_with_the_fix(fake_llm: FakeLLM) -> None:
    url = fake_llm.base_url
    await fake_llm.stop()
    emb = _embedder(url)
    try:
        started = time.monotonic()
        with pytest.raises(EmbeddingUnavailable) as err:
            await emb.embed([f"my secret is {SECRET}"])
        assert time.monotonic() - started < 2
        msg = str(err.value)
        assert "connection failed" in msg and "Fix:" in msg and "ollama pull fake-embed" in msg
        assert SECRET not in msg
    finally:
        await emb.close()


async def test_one_retry_for_a_5xx_none_for_a_missing_model(fake_llm: FakeLLM) -> None:
    emb = _embedder(fake_llm.base_url)
    try:
        fake_llm.embed_script = [("status", 503, {"error": "loading"})]
        assert len(await emb.embed(["a"])) == 1
        assert len(fake_llm.embed_requests) == 2
        fake_llm.embed_script = [("status", 503, {}), ("status", 503, {})]
        with pytest.raises(EmbeddingUnavailable, match="HTTP 503"):
            await emb.embed(["a"])
        assert len(fake_llm.embed_requests) == 4
        fake_llm.embed_script = [("status", 404, {"error": {"message": "model not found"}})]
        with pytest.raises(EmbeddingUnavailable, match="HTTP 404"):
            await emb.embed(["a"])
        assert len(fake_llm.embed_requests) == 5
    finally:
        await emb.close()


async def test_slow_server_times_out_without_a_retry(fake_llm: FakeLLM) -> None:
    emb = _embedder(fake_llm.base_url, read_timeout=0.3, connect_timeout=0.3)
    fake_llm.embed_script = [("sleep", 2)]
    try:
        started = time.monotonic()
        with pytest.raises(EmbeddingUnavailable, match="timed out"):
            await emb.embed(["a"])
        assert time.monotonic() - started < 1.5
        assert len(fake_llm.embed_requests) == 1
    finally:
        await emb.close()


def test_retry_delay_grows_with_jitter_and_caps() -> None:
    rng = random.Random(7)
    delays = [retry_delay(n, initial=1.0, maximum=10.0, rng=rng) for n in range(1, 9)]
    bases = [1, 2, 4, 8, 10, 10, 10, 10]
    assert all(b / 2 <= d <= b for d, b in zip(delays, bases, strict=True))
    assert len({round(d, 6) for d in delays[4:]}) > 1  # jittered, not lockstep
    assert retry_delay(10_000, initial=1.0, maximum=10.0) <= 10.0


# --- the indexer in a running app ------------------------------------------------------------
async def test_turns_are_embedded_in_the_background_and_related_ones_score_higher(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, extra=ENABLED)
    try:
        assert h.app.indexer is not None and h.app.indexer.model == "nomic-embed-text"
        for text in ("my antenna is a yagi on the roof", "I had pizza for lunch", "hello there"):
            await h.say(text)
        conv = await h.store.conversation(h.transport_key("alice"))
        await _until_empty(h.store, "nomic-embed-text")
        assert await _count(h.store, "message_vectors") == 6  # 3 questions + 3 answers
        emb = _embedder(fake_llm.base_url)
        try:
            (query,) = await emb.embed(["what antenna is on my roof?"])
        finally:
            await emb.close()
        hits = await h.store.vector_search(
            conv.id, query, model="nomic-embed-text", after_id=0, before_id=10**9, limit=3
        )
        best = (await h.store.messages_by_ids([hits[0][0]]))[0]
        assert best.text == "my antenna is a yagi on the roof"
    finally:
        await h.app.close()
    assert not h.app.indexer.running


async def _until_empty(store: SqliteStore, model: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while await store.messages_missing_vectors(model, limit=1):
        assert time.monotonic() < deadline, "the indexer did not catch up"
        await asyncio.sleep(0.02)


async def test_a_slow_embedding_server_never_delays_a_reply(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, extra=ENABLED + "    query_timeout: 0.2\n")
    try:
        # More history than the window holds, so the reply's context does search older turns.
        conv = await h.store.conversation(h.transport_key("alice"))
        for i in range(500):
            await h.store.add_message(conv.id, role="user" if i % 2 == 0 else "assistant",
                                      author="alice", text=f"older note {i} about hello",
                                      tokens=6, status="answered")  # fmt: skip
        fake_llm.embed_script = [("sleep", 3.0)]
        await h.say("hello")
        assert h.transport.sent and h.transport.sent[-1].text == fake_llm.reply
        # The reply went out while the new message's embedding was still being computed.
        assert fake_llm.embed_requests[0]["input"] == ["hello"]
        assert fake_llm.embeds_answered == 0
    finally:
        await h.app.close()


async def test_indexer_warns_once_per_outage_and_catches_up(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="bot")
    store = await SqliteStore.open(tmp_path / "m.db")
    emb = _embedder(fake_llm.base_url)
    indexer = Indexer(store=store, embedder=emb, batch=4, backfill_seconds=30,
                      startup_delay=30, retry_initial=0.05, retry_max=0.1)  # fmt: skip
    port = fake_llm.port
    try:
        conv = await store.conversation(KEY)
        other = await store.conversation(ConversationKey("console", "bob"))
        await fake_llm.stop()
        indexer.start()
        for i in range(6):
            text = f"{SECRET} number {i}"
            await store.add_message(conv.id, role="user", author="alice", text=text, tokens=3,
                                    status="answered")  # fmt: skip
        await store.add_message(other.id, role="user", author="bob", text="unscheduled",
                                tokens=1, status="answered")  # fmt: skip
        assert indexer.schedule(conv.id)
        await asyncio.sleep(0.6)  # several retries while the server is down
        assert not indexer.available
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "retrieval uses words only" in warnings[0].getMessage()
        await fake_llm.start(port=port)
        await _until_empty(store, emb.model)  # bob's message too: a full catch-up on recovery
        assert indexer.available and indexer.embedded == 7
        assert any("is back" in r.getMessage() for r in caplog.records)
        assert all(SECRET not in r.getMessage() for r in caplog.records)
    finally:
        await indexer.stop(timeout=2)
        await emb.close()
        await store.close()
    assert not indexer.running and not indexer.schedule(conv.id)


async def test_stop_is_bounded_while_a_request_hangs(tmp_path: Path, fake_llm: FakeLLM) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    emb = _embedder(fake_llm.base_url, read_timeout=60)
    indexer = Indexer(store=store, embedder=emb, batch=4, startup_delay=0)
    try:
        conv = await store.conversation(KEY)
        await store.add_message(conv.id, role="user", author="a", text="x", tokens=1,
                                status="answered")  # fmt: skip
        fake_llm.embed_script = [("sleep", 30)]
        indexer.start()
        await _until(lambda: len(fake_llm.embed_requests) == 1)
        started = time.monotonic()
        await indexer.stop(timeout=0.3)
        assert time.monotonic() - started < 1.0 and not indexer.running
    finally:
        await emb.close()
        await store.close()


async def test_catch_up_waits_while_a_turn_runs(tmp_path: Path, fake_llm: FakeLLM) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    emb = _embedder(fake_llm.base_url)
    idle = False
    indexer = Indexer(store=store, embedder=emb, batch=4, startup_delay=0,
                      idle=lambda: idle)  # fmt: skip
    try:
        conv = await store.conversation(KEY)
        await store.add_message(conv.id, role="user", author="a", text="x", tokens=1,
                                status="answered")  # fmt: skip
        indexer.start()
        await asyncio.sleep(0.3)
        assert fake_llm.embed_requests == []
        idle = True
        await _until_empty(store, emb.model)
    finally:
        await indexer.stop(timeout=2)
        await emb.close()
        await store.close()


# --- storage details on SQLite ---------------------------------------------------------------
async def test_forget_leaves_no_row_about_the_person_in_any_table(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, extra=ENABLED)
    try:
        await h.say("bob's kumquat tree", sender="bob")
        await _until_empty(h.store, "nomic-embed-text")
        tables = [
            r[0]
            for r in await h.store._all("SELECT name FROM sqlite_master WHERE type = 'table'")
            # FTS5 segments are rewritten by merges (checked by a search below); AUTOINCREMENT
            # high-water marks hold no one's data; an answered command keeps a row naming no
            # one, for Discord catch-up (checked below).
            if r[0]
            not in ("messages_fts_data", "messages_fts_idx", "sqlite_sequence", "held_commands")
        ]
        assert "message_vectors" in tables
        before = {t: await _count(h.store, t) for t in tables}
        await h.say("alice's kumquat jam", sender="alice")
        await h.say("!remember I like kumquats", sender="alice")
        await _until_empty(h.store, "nomic-embed-text")
        assert await _count(h.store, "message_vectors") == before["message_vectors"] + 2
        report = await h.store.forget_person(h.transport.name, "alice")
        assert report.messages == 2
        after = {t: await _count(h.store, t) for t in tables}
        assert after == before
        named = await h.store._all(
            "SELECT count(*) FROM held_commands WHERE person != '' OR space != '' OR text != '' "
            "OR author IS NOT NULL"
        )
        assert named[0][0] == 0
        alice = await h.store.conversation(h.transport_key("alice"))
        assert await h.store.search_terms(alice.id, ["kumquat"], after_id=0,
                                          before_id=10**9) == [[]]  # fmt: skip
    finally:
        await h.app.close()


async def test_vectors_written_by_another_process_are_seen(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    bot = await SqliteStore.open(path)
    cli = await SqliteStore.open(path)  # `meshsage memory reindex` while the bot runs
    try:
        conv = await bot.conversation(KEY)
        a = await bot.add_message(conv.id, role="user", author="a", text="a", tokens=1,
                                  status="x")  # fmt: skip
        b = await bot.add_message(conv.id, role="user", author="a", text="b", tokens=1,
                                  status="x")  # fmt: skip
        await bot.add_vectors([(b, conv.id, "m", [0.0, 1.0])])
        args = dict(model="m", after_id=0, before_id=10**9, limit=5)
        assert [h[0] for h in await bot.vector_search(conv.id, [1.0, 0.0], **args)] == [b]  # type: ignore[arg-type]
        await cli.add_vectors([(a, conv.id, "m", [1.0, 0.0])])
        assert [h[0] for h in await bot.vector_search(conv.id, [1.0, 0.0], **args)] == [a, b]  # type: ignore[arg-type]
    finally:
        await cli.close()
        await bot.close()


async def test_retention_takes_vectors_with_the_messages(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        conv = await store.conversation(KEY)
        old = await store.add_message(conv.id, role="user", author="a", text="old", tokens=1,
                                      status="x", created_at=1000.0)  # fmt: skip
        new = await store.add_message(conv.id, role="user", author="a", text="new", tokens=1,
                                      status="x")  # fmt: skip
        await store.add_vectors([(old, conv.id, "m", [1.0, 0.0]), (new, conv.id, "m", [0.0, 1.0])])
        args = dict(model="m", after_id=0, before_id=10**9, limit=5)
        assert len(await store.vector_search(conv.id, [1.0, 0.0], **args)) == 2  # type: ignore[arg-type]
        assert await store.prune_older_than(2000.0) == 1
        assert await _count(store, "message_vectors") == 1
        assert [h[0] for h in await store.vector_search(conv.id, [1.0, 0.0], **args)] == [new]  # type: ignore[arg-type]
    finally:
        await store.close()


# --- meshsage memory reindex ------------------------------------------------------------------
def _cli_env(tmp_path: Path, llm_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHSAGE_", "OPENAI_"))}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "state"), MESHSAGE_LLM_BASE_URL=llm_url,
               MESHSAGE_LLM_MODEL="fake", TIKTOKEN_CACHE_DIR="")  # fmt: skip
    return env


async def _reindex(config: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "memory", "reindex", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_reindex_backfills_every_visible_message(tmp_path: Path, fake_llm: FakeLLM) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(ENABLED + "    batch: 3\n", encoding="utf-8")
    env = _cli_env(tmp_path, fake_llm.base_url)
    store = await SqliteStore.open(load_config(config, env=env).database_path)
    alice = await store.conversation(KEY)
    bob = await store.conversation(ConversationKey("console", "bob"))
    await store.add_messages(alice.id, [("user", "a", f"{SECRET} {i}", 1, 1e9) for i in range(4)])
    await store.reset(alice.id)  # hidden for good: not embedded
    await store.add_messages(alice.id, [("user", "a", f"later {i}", 1, 1e9) for i in range(3)])
    await store.add_messages(bob.id, [("user", "b", f"bob {i}", 1, 1e9) for i in range(5)])
    await store.close()

    rc, err = await _reindex(config, env)
    assert rc == 0, err
    assert "reindex: 8 message(s) embedded with nomic-embed-text" in err
    assert SECRET not in err
    assert sum(len(r["input"]) for r in fake_llm.embed_requests) == 8
    assert max(len(r["input"]) for r in fake_llm.embed_requests) == 3
    rc, err = await _reindex(config, env)
    assert rc == 0 and "reindex: 0 message(s) embedded" in err
    store = await SqliteStore.open(load_config(config, env=env).database_path)
    try:
        assert await store.messages_missing_vectors("nomic-embed-text", limit=9) == []
        assert await _count(store, "message_vectors") == 8
    finally:
        await store.close()


async def test_reindex_says_how_to_fix_disabled_or_unreachable(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    disabled = tmp_path / "off.yaml"
    disabled.write_text("memory:\n  embeddings:\n    enabled: false\n", encoding="utf-8")
    rc, err = await _reindex(disabled, _cli_env(tmp_path, fake_llm.base_url))
    assert rc == 2
    assert err.strip().count("\n") == 0
    assert "memory.embeddings is disabled" in err and "Fix: set memory.embeddings.enabled" in err

    enabled = tmp_path / "on.yaml"
    enabled.write_text(ENABLED, encoding="utf-8")
    url = fake_llm.base_url
    store = await SqliteStore.open(tmp_path / "state" / "meshsage.db")
    conv = await store.conversation(KEY)
    await store.add_messages(conv.id, [("user", "a", "hello", 1, 1e9)])
    await store.close()
    await fake_llm.stop()
    rc, err = await _reindex(enabled, _cli_env(tmp_path, url))
    assert rc == 6, err
    lines = [line for line in err.splitlines() if line.startswith("meshsage:")]
    assert len(lines) == 1 and "connection failed" in lines[0] and "Fix:" in lines[0]
    assert "Traceback" not in err


async def test_disabled_by_default_builds_nothing_and_asks_nothing(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.say("hello")
        assert h.app.indexer is None and h.app._close_embedder is None
    finally:
        await h.app.close()
    assert fake_llm.embed_requests == []
