"""Recovery after a restart: every stored question gets its own answer, in order, whatever its
age (too old for its transport's ``delivery.max_age``: the person is told instead), and a
running gateway takes over questions whose gateway died (stale claim).

Before: only each person's latest pending question was recovered, the earlier ones were folded
into its prompt and marked answered (one answer for up to 13 questions), and questions older
than 15 minutes were never answered nor told. Commands are held in the store until answered:
one lost to a kill is run at the next start, and a ``!forget yes`` whose delete finished is
confirmed (before: no reply to either)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bot.memory.keep import CLAIM_STALE_SECONDS
from bot.memory.store import USER
from bot.recovery import FORGOT_AT_RESTART
from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM


def _echo(body: dict[str, Any]) -> str:
    return "answer to " + str(body["messages"][-1]["content"]).strip().splitlines()[-1]


async def _store_pending(h: Harness, texts: list[str], *, age: float = 0.0) -> list[int]:
    conv = await h.store.conversation(h.transport_key("alice"))
    ids = []
    for i, text in enumerate(texts):
        ids.append(
            await h.store.add_message(
                conv.id,
                role=USER,
                author="alice",
                text=text,
                tokens=3,
                status="pending",
                created_at=time.time() - age + i,
                platform_id=f"p{text}",
            )
        )
    return ids


async def _statuses(h: Harness) -> list[tuple[str, str, str]]:
    rows = await h.store._all("SELECT role, text, status FROM messages ORDER BY id")
    return [tuple(r) for r in rows]


async def test_each_pending_question_gets_its_own_answer_in_order(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _echo
    h = await start_harness(tmp_path, fake_llm)
    await _store_pending(h, ["q1", "q2", "q3"])
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        assert h.transport.texts() == ["answer to q1", "answer to q2", "answer to q3"]
        assert [s[2] for s in await _statuses(h) if s[0] == "user"] == ["answered"] * 3
        prompts = [[m["content"] for m in r["messages"]] for r in fake_llm.chat_requests()]
        assert len(prompts) == 3
        # the later question's prompt holds the earlier ones with their answers
        assert "answer to q1" in "\n".join(prompts[1]) and "q3" not in "\n".join(prompts[1])
    finally:
        await h.app.close()


async def test_a_question_older_than_max_age_is_told_once_not_dropped(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _echo
    h = await start_harness(tmp_path, fake_llm)
    await _store_pending(h, ["old"], age=3 * 3600)
    await _store_pending(h, ["recent"], age=20 * 60)  # once too old to recover (15 min)
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        texts = h.transport.texts()
        assert len(texts) == 2 and texts[1] == "answer to recent"
        assert texts[0].startswith("Sorry, I was offline when you wrote 3 h ago")
        assert len(fake_llm.chat_requests()) == 1  # the old one was not sent to the model
        statuses = [s[2] for s in await _statuses(h) if s[0] == "user"]
        assert statuses == ["expired", "answered"]
        await h.app.close()
        h = await start_harness(tmp_path, fake_llm)
        await h.app.responder.wait_idle()
        assert h.transport.texts() == []  # told once
    finally:
        await h.app.close()


async def test_a_running_gateway_takes_over_a_question_with_a_stale_claim(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _echo
    h = await start_harness(tmp_path, fake_llm)
    try:
        [live] = await _store_pending(h, ["live"], age=10)
        [dead] = await _store_pending(h, ["dead"], age=CLAIM_STALE_SECONDS + 60)
        await h.store._exec(  # another gateway claimed both; one of them died long ago
            "UPDATE messages SET claimed_by = 'other', claimed_at = ? WHERE id = ?",
            (time.time(), live),
        )
        await h.store._exec(
            "UPDATE messages SET claimed_by = 'other', claimed_at = ? WHERE id = ?",
            (time.time() - CLAIM_STALE_SECONDS - 30, dead),
        )
        assert await h.app.responder.take_over_stale() == 1
        await h.app.responder.wait_idle()
        assert h.transport.texts() == ["answer to dead"]
        assert await h.app.responder.take_over_stale() == 0  # answered: never twice
    finally:
        await h.app.close()


async def test_a_command_lost_to_a_kill_is_run_at_the_next_start(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Commands are stored before they run; one a kill interrupted (still held) is run when
    the bot starts again, and released once its reply is in the outbox."""
    h = await start_harness(tmp_path, fake_llm)
    await h.say("!remember my boat is the Heron")
    assert await h.store.held_commands(transports=["fake"]) == []  # released once answered
    await h.store.hold_command(h.transport_key("alice"), "!facts", platform_id="p9",
                               author="alice", authenticated=True)  # fmt: skip
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        [reply] = h.transport.texts()
        assert "my boat is the Heron" in reply
        assert await h.store.held_commands(transports=["fake"]) == []
    finally:
        await h.app.close()


async def test_a_forget_interrupted_after_the_delete_is_told_at_restart(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    await h.say("hello")
    await h.say("!forget")
    # killed after "!forget yes" was held and the delete committed, before the reply
    await h.store.hold_command(h.transport_key("alice"), "!forget yes", platform_id="p2",
                               author="alice", authenticated=True)  # fmt: skip
    await h.store.forget_person("fake", "alice")
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        assert h.transport.texts() == [FORGOT_AT_RESTART]
    finally:
        await h.app.close()


async def test_a_forget_yes_killed_before_the_delete_is_not_called_done(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    await h.say("hello")
    await h.store.hold_command(h.transport_key("alice"), "!forget yes", platform_id="p3",
                               author="alice", authenticated=True)  # fmt: skip
    await h.app.close()
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.app.responder.wait_idle()
        [reply] = h.transport.texts()
        assert reply.startswith("Nothing to confirm")  # nothing was deleted: it says so
    finally:
        await h.app.close()
