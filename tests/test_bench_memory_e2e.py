"""bench.memory_e2e through the real app and the fake LLM over HTTP: a message the bot sends no
reply request for (here a command, answered without the model) does not stop the run; the
bench says what the person got, scores the question 0 and counts it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.e2e_score import Tally, dated, score, sent_tokens, table
from bench.memory_e2e import (
    PERSON,
    ReplayClock,
    Script,
    Split,
    Unanswered,
    ask,
    exchanges,
    replay,
    started,
    tally,
)
from bench.prefix import CONTEXT_TOKENS, STYLE_HINT, TRANSPORT, bench_config, is_reply
from bench.recall import Dialogue, Question, Turn
from bot.config import LLMConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.tokens import make_counter
from tests.fakes.fake_llm import FakeLLM


async def test_a_message_without_a_reply_request_is_counted_not_fatal(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    app, transport = await started(tmp_path / "state", fake_llm.base_url, None)
    try:
        with pytest.raises(Unanswered, match=r"0 reply requests .*the person got \[.command: "):
            await ask(app, transport, fake_llm, "!status", 1)
        body = await ask(app, transport, fake_llm, "hello there, my boat is Osprey", 2)
        assert STYLE_HINT in body["messages"][0]["content"]
        into = Tally()
        question = Question("What is my boat called?", ("d1",), 4)
        dlg = Dialogue("s", "A", [Turn("d1", "A", "my boat is Osprey", 0.0)], [question])
        said: list[str] = []
        counter = make_counter()
        await tally(into, question, ask(app, transport, fake_llm, "!status", 3), dlg,
                    counter, said.append)  # fmt: skip
        asked = ask(app, transport, fake_llm, "What is my boat called?", 4)
        await tally(into, question, asked, dlg, counter, said.append)
    finally:
        await app.close()
    assert into.recall[4] == [0.0, 1.0] and len(into.unanswered) == 1
    assert "the person got" in said[0]
    assert "| 1 |" in table({"restart": into}, [4])  # the "no reply request" column


DAY = 86_400.0
MAY_8 = 1_683_554_160.0  # 2023-05-08 13:56 UTC


def _dialogue(starts: list[float], lines_per_session: int = 4, words: int = 8) -> Dialogue:
    """Sessions of alternating A/B lines at the given start times (a line a second), each A
    line naming its session, so a question can find it."""
    turns = []
    for s, start in enumerate(starts, 1):
        for i in range(lines_per_session):
            speaker = "A" if i % 2 == 0 else "B"
            text = f"session{s} line{i} " + " ".join(f"word{s}x{i}x{k}" for k in range(words))
            turns.append(Turn(f"D{s}:{i + 1}", speaker, text, start + i))
    return Dialogue("synthetic", "A", turns, [])


async def _replayed(tmp_path: Path, fake: FakeLLM, dlg: Dialogue, *, end: bool = True) -> Any:
    script = Script()
    fake.reply_fn = script
    exs = exchanges(dlg)
    clock = ReplayClock(exs[0].at)
    app, transport = await started(tmp_path / "state", fake.base_url, None, wall=clock)
    await replay(app, transport, fake, script, exs, clock, end=end, log=lambda _: None)
    return app, transport, clock


async def _log(app: Any) -> tuple[Any, list[Any], list[Any]]:
    conv = await app.store.conversation(ConversationKey(TRANSPORT, PERSON))
    return conv, await app.store.all_messages(conv.id), await app.store.sessions(conv.id)


async def test_a_dated_replay_closes_sessions_and_recall_carries_the_recorded_dates(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    starts = [MAY_8, MAY_8 + 12 * DAY, MAY_8 + 40 * DAY]
    dlg = _dialogue(starts, lines_per_session=10, words=40)  # the first is out of the window
    app, transport, clock = await _replayed(tmp_path, fake_llm, dlg)
    try:
        conv, log, sessions = await _log(app)
        # every message (the bot's answers too) is dated as recorded, none today
        assert {int(m.created_at // DAY) for m in log} == {int(s // DAY) for s in starts}
        assert len(sessions) == 3 and all(s.summary for s in sessions)
        assert await app.store.has_longterm_summary(conv.id)
        question = Question("What was word1x0x3 about?", ("D1:1",), 2)
        body = await ask(app, transport, fake_llm, question.text, 999, clock.now)
    finally:
        await app.close()
    sent = "\n".join(m["content"] for m in body["messages"])
    assert "[8 May 2023]" in sent  # the recall note's date line: the recorded day
    times = {t.dia_id: t.created_at for t in dlg.turns}
    assert dated(question, body, times) == 1.0
    assert score(question, body, {t.dia_id: t.text for t in dlg.turns}) == 1.0


async def test_dates_that_go_backwards_or_repeat_invent_no_session_and_keep_their_dates(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    starts = [MAY_8, MAY_8 - 10 * DAY, MAY_8 - 10 * DAY, MAY_8 + 3 * DAY]
    app, _, _ = await _replayed(tmp_path, fake_llm, _dialogue(starts))
    try:
        _, log, sessions = await _log(app)
    finally:
        await app.close()
    assert len(log) == 16  # every message answered: 4 sessions x 2 exchanges x 2
    assert sorted({int(m.created_at // DAY) for m in log}) == sorted(
        {int(s // DAY) for s in starts}
    )
    # only the forward pause of 13 days ends a session; going back or repeating does not
    assert [s.messages for s in sessions] == [12, 4]


async def test_two_sessions_in_one_minute_are_one_session(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    app, _, _ = await _replayed(tmp_path, fake_llm, _dialogue([MAY_8, MAY_8 + 30]))
    try:
        _, log, sessions = await _log(app)
    finally:
        await app.close()
    assert len(log) == 8 and [s.messages for s in sessions] == [8]


async def test_a_person_who_never_pauses_closes_no_session_and_the_window_still_folds(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    starts = [MAY_8 + 60 * i for i in range(40)]  # a session a minute, 80 exchanges, no pause
    dlg = _dialogue(starts, words=30)
    app, _, _ = await _replayed(tmp_path, fake_llm, dlg, end=False)
    counter = make_counter()
    try:
        conv, log, sessions = await _log(app)
        chapters = await app.store.summaries(conv)
    finally:
        await app.close()
    assert len(log) == 160 and sessions == []  # nothing closed while they kept talking
    assert chapters  # the window folded into chapters all the same
    replies = [r for r in fake_llm.requests if is_reply(r)]
    assert len(replies) == 80
    assert max(sent_tokens(r, counter) for r in replies) <= CONTEXT_TOKENS


async def test_with_a_memory_model_every_background_call_goes_to_it_and_replies_do_not(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """``--memory-url``: chapters, session and long-term summaries and fact extraction are
    written by the memory model; the replayed answers still come from the script."""
    memory_model = FakeLLM()
    memory_model.reply = "Title\nThey talked about words."
    await memory_model.start()
    script = Script()
    fake_llm.reply_fn = script
    replies = OpenAICompatLLM(config=bench_config(tmp_path, fake_llm.base_url).llm, env={})
    memory = OpenAICompatLLM(
        config=LLMConfig(base_url=memory_model.base_url, model="small", api_key_env=None), env={}
    )
    split = Split(replies=replies, memory=memory)
    dlg = _dialogue([MAY_8, MAY_8 + 12 * DAY], lines_per_session=10, words=40)
    exs = exchanges(dlg)
    clock = ReplayClock(exs[0].at)
    app, transport = await started(tmp_path / "s", fake_llm.base_url, None, wall=clock, llm=split)
    try:
        await replay(app, transport, fake_llm, script, exs, clock, log=lambda _: None)
        _, _, sessions = await _log(app)
        # (asked of the memory model; its answer, not grounded in the turns, gives way to a
        # digest of them: issue 37)
        assert len(sessions) == 2 and all(s.summary for s in sessions)
    finally:
        await app.close()
        await replies.close()
        await memory.close()
        await memory_model.stop()
    assert all(is_reply(r) for r in fake_llm.requests)
    assert len(fake_llm.requests) == len(exs)
    assert split.calls == len(memory_model.requests) >= 4  # sessions, long-term, facts, chapters
    assert not any(is_reply(r) for r in memory_model.requests)
