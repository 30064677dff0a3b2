"""Sessions: closed by an idle gap (injected clock) or !reset, robust to the clock jumping
backwards, summarized in the background, rolled into a long-term summary that joins the
prompt of that conversation only; !sessions; ``meshsage memory rebuild`` with a progress bar."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bot.cli import main
from bot.config import LLMConfig
from bot.domain import ConversationKey
from bot.errors import LLMUnavailable
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.tokens import make_counter
from bot.memory.sessions import SESSION_PROMPT, SessionKeeper, split_sessions
from bot.memory.store import SqliteStore
from bot.memory.window import day_line
from tests.conftest import Harness, make_config, start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport
from tests.fakes.memory_script import MemoryScript

KEY = ConversationKey("console", "alice")
T0 = 1_700_000_000.0
HOUR = 3600.0


def _llm(fake: FakeLLM) -> OpenAICompatLLM:
    cfg = LLMConfig.model_validate({"base_url": fake.base_url, "model": "m", "retries": 0})
    return OpenAICompatLLM(config=cfg, env={})


class Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


SAID = "we compared radio antennas, I chose a 5 dBi whip"  # what the script's summary says


async def _msgs(store: SqliteStore, times: list[float], key: ConversationKey = KEY) -> list[int]:
    conv = await store.conversation(key)
    return [
        await store.add_message(conv.id, role="user" if i % 2 == 0 else "assistant",
                                author="alice" if i % 2 == 0 else "bot",
                                text=f"antenna talk {i}: {SAID}", tokens=3, status="answered",
                                created_at=t)
        for i, t in enumerate(times)
    ]  # fmt: skip


async def test_session_closes_after_the_gap_on_an_injected_clock(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    script = MemoryScript()
    fake_llm.reply_fn = script
    wall = Wall(T0)
    llm = _llm(fake_llm)
    keeper = SessionKeeper(store=store, llm=llm, counter=make_counter(), gap=6 * HOUR,
                           extractor=None, wall=wall)  # fmt: skip
    first = await _msgs(store, [T0, T0 + 60, T0 + 120, T0 + 180])
    conv = await store.conversation(KEY)

    wall.now = T0 + 180 + 5 * HOUR  # idle 5 h: still the same session
    assert (await keeper.tick()).closed == 0
    assert await store.sessions(conv.id) == []

    wall.now = T0 + 180 + 6 * HOUR + 1  # idle past the gap: closed and summarized
    report = await keeper.tick()
    assert (report.closed, report.summarized) == (1, 1)
    [session] = await store.sessions(conv.id)
    assert (session.first_message_id, session.last_message_id) == (first[0], first[-1])
    assert (session.started_at, session.ended_at, session.messages) == (T0, T0 + 180, 4)
    assert (session.title, session.summary) == (script.title, script.summary)
    longterm = await store.longterm_summary(conv.id)
    assert longterm is not None and longterm.text == script.longterm and longterm.sessions == 1
    # The session's input is dated as the window is (a summary can keep when it was said).
    [asked] = [r["messages"][1]["content"] for r in fake_llm.chat_requests()
               if r["messages"][0]["content"] == SESSION_PROMPT]  # fmt: skip
    assert asked.startswith(day_line(T0) + "\n") and asked.count("\n[") == 0

    # A later burst after a long pause is a second session; the long-term summary is rebuilt
    # from the previous one plus the new session summary (its cost does not grow).
    await _msgs(store, [T0 + 20 * HOUR, T0 + 20 * HOUR + 30])
    wall.now = T0 + 27 * HOUR
    script.longterm = "LONGTERM: the person chose the whip."
    assert (await keeper.tick()).closed == 1
    assert [s.messages for s in await store.sessions(conv.id)] == [4, 2]
    prompt = fake_llm.chat_requests()[-1]["messages"][1]["content"]
    assert script.summary in prompt and "Existing summary: LONGTERM: the person" in prompt
    assert "antenna talk" not in prompt  # session summaries, not the raw log
    await llm.close()


def test_clock_jumping_backwards_does_not_split_or_reorder_sessions() -> None:
    from bot.memory.records import StoredMessage

    def msg(i: int, t: float) -> StoredMessage:
        return StoredMessage(i, 1, "user", "a", "x", t, 1, None, None, "answered")

    # A Pi without RTC: the clock falls back a year before NTP fixes it.
    times = [T0, T0 + 60, T0 - 365 * 86400, T0 - 365 * 86400 + 60, T0 + 120]
    groups = split_sessions([msg(i, t) for i, t in enumerate(times, 1)], gap=6 * HOUR)
    # The backward jump invents no boundary; the jump forward again (NTP) is a real gap.
    assert [[m.id for m in g] for g in groups] == [[1, 2, 3, 4], [5]]
    # A reset mark always ends a session.
    groups = split_sessions([msg(i, T0 + i) for i in range(1, 6)], gap=6 * HOUR, reset_after=2)
    assert [[m.id for m in g] for g in groups] == [[1, 2], [3, 4, 5]]


async def test_clock_behind_the_last_message_keeps_the_session_open(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = MemoryScript()
    llm = _llm(fake_llm)
    wall = Wall(T0 - 86400)  # the clock is a day behind the stored messages
    keeper = SessionKeeper(store=store, llm=llm, counter=make_counter(), gap=6 * HOUR,
                           extractor=None, wall=wall)  # fmt: skip
    await _msgs(store, [T0, T0 + 60])
    assert (await keeper.tick()).closed == 0
    await llm.close()


async def test_reset_closes_the_session(store: SqliteStore, fake_llm: FakeLLM) -> None:
    fake_llm.reply_fn = MemoryScript()
    llm = _llm(fake_llm)
    keeper = SessionKeeper(store=store, llm=llm, counter=make_counter(), gap=6 * HOUR,
                           extractor=None, wall=Wall(T0 + 60))  # fmt: skip
    ids = await _msgs(store, [T0, T0 + 30])
    conv = await store.conversation(KEY)
    await store.reset(conv.id)
    assert (await keeper.tick()).closed == 1
    [session] = await store.sessions(conv.id)
    assert session.last_message_id == ids[-1]
    await llm.close()


async def _harness(
    tmp_path: Path, fake_llm: FakeLLM, *, context_tokens: int = 1024
) -> tuple[Harness, MemoryScript]:
    script = MemoryScript(reply="sure")
    fake_llm.reply_fn = script
    h = await start_harness(
        tmp_path,
        fake_llm,
        transport=FakeTransport(context_tokens=context_tokens),
        extra="bot:\n  rate_limit:\n    messages: 1000\n    per_seconds: 1\n",
    )
    return h, script


def _system(fake_llm: FakeLLM) -> str:
    content: str = fake_llm.chat_requests()[-1]["messages"][0]["content"]
    return content


async def test_longterm_summary_joins_the_prompt_once_the_window_moved_past_it(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h, script = await _harness(tmp_path, fake_llm, context_tokens=400)
    try:
        dm = h.transport_key("alice")
        ago = time.time() - 10 * HOUR  # the session is over (and recent enough to summarize)
        await _msgs(h.store, [ago + i for i in range(6)], key=dm)
        assert h.app.sessions is not None
        assert (await h.app.sessions.tick()).summarized == 1
        # While the window still shows the closed session's turns verbatim, the prompt keeps
        # its earlier form (no version covers only what the window does not show).
        await h.say("what antenna did I pick?")
        assert script.longterm not in _system(fake_llm)
        for i in range(12):
            await h.say(f"new session message {i} with a few more words in it")
        system = _system(fake_llm)
        assert script.longterm in system
        assert system.index(script.longterm) < system.index("LoRa mesh radio. Answer") + 400
        # Stable: the next turn's prompt starts with the same bytes up to the long-term block.
        prefix = system[: system.index(script.longterm) + len(script.longterm)]
        await h.say("one more")
        assert _system(fake_llm).startswith(prefix)
        await h.say("@bot hello", space="ch0")  # another conversation: never there
        assert script.longterm not in _system(fake_llm)

        await h.say("!sessions")
        assert h.transport.texts()[-1].startswith("Sessions: ")
        assert script.title in h.transport.texts()[-1]
        assert len(h.transport.texts()[-1].encode()) <= 200

        await h.say("!reset")  # nothing from before a reset is used, the long-term included
        await h.say("fresh start")
        assert script.longterm not in _system(fake_llm)
    finally:
        await h.app.close()


async def test_background_session_work_waits_while_a_turn_runs(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h, script = await _harness(tmp_path, fake_llm)
    try:
        ago = time.time() - 10 * HOUR
        await _msgs(h.store, [ago, ago + 60], key=h.transport_key("alice"))
        assert h.app.sessions is not None
        keeper = h.app.sessions
        keeper._idle = lambda: False  # a turn is running: closing is fine, the LLM is not
        report = await keeper.tick()
        assert (report.closed, report.summarized) == (1, 0)
        assert "session" not in script.seen
    finally:
        await h.app.close()


async def test_memory_rebuild_redoes_sessions_with_a_progress_bar(
    tmp_path: Path, fake_llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    script = MemoryScript()
    fake_llm.reply_fn = script
    config = make_config(tmp_path, fake_llm.base_url)
    store = await SqliteStore.open(config.database_path)
    await _msgs(store, [T0, T0 + 60, T0 + 10 * HOUR, T0 + 20 * HOUR, T0 + 20 * HOUR + 5])
    await store.close()
    # main() runs its own event loop: in a thread, while this loop serves the fake LLM.
    code = await asyncio.to_thread(
        main, ["memory", "rebuild", "alice", "--config", str(tmp_path / "config.yaml")]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "[" + "#" * 30 + "] 3/3 sessions" in err and "rewritten" in err
    store = await SqliteStore.open(config.database_path)
    conv = await store.conversation(KEY)
    sessions = await store.sessions(conv.id)
    assert [s.messages for s in sessions] == [2, 1, 2]
    assert all(s.title == script.title for s in sessions)
    assert (await store.longterm_summary(conv.id)) is not None
    await store.close()


async def test_a_failed_longterm_update_is_caught_up(store: SqliteStore, fake_llm: FakeLLM) -> None:
    script = MemoryScript()
    fake_llm.reply_fn = script
    llm = _llm(fake_llm)
    keeper = SessionKeeper(store=store, llm=llm, counter=make_counter(), gap=6 * HOUR,
                           extractor=None, wall=Wall(T0 + 100 * HOUR))  # fmt: skip
    ids = await _msgs(store, [T0, T0 + 60, T0 + 10 * HOUR])  # two closed sessions
    conv = await store.conversation(KEY)
    fake_llm.script = ["ok", ("status", 500, {"error": {"message": "busy"}})]
    with pytest.raises(LLMUnavailable):
        await keeper.tick()  # first session summarized; its long-term call failed
    assert await store.longterm_summary(conv.id) is None
    await keeper.tick()  # catch-up first, then the second session
    lt = await store.longterm_summary(conv.id)
    assert lt is not None and (lt.sessions, lt.up_to_message_id) == (2, ids[-1])
    assert all(s.summary for s in await store.sessions(conv.id))
    await llm.close()


async def test_sessions_older_than_the_backfill_window_wait_for_a_rebuild(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    from bot.memory.sessions import BACKFILL_SECONDS

    fake_llm.reply_fn = MemoryScript()
    llm = _llm(fake_llm)
    now = Wall(T0 + BACKFILL_SECONDS + 100 * HOUR)
    keeper = SessionKeeper(store=store, llm=llm, counter=make_counter(), gap=6 * HOUR,
                           extractor=None, wall=now)  # fmt: skip
    await _msgs(store, [T0, T0 + 60, T0 + BACKFILL_SECONDS + 10 * HOUR])
    report = await keeper.tick()
    assert (report.closed, report.summarized) == (2, 1)  # only the recent one
    conv = await store.conversation(KEY)
    assert [s.summary is not None for s in await store.sessions(conv.id)] == [False, True]
    await llm.close()
