"""Date lines in the window (bot.memory.window) and in a chapter's input (bot.memory.summary):
a person's message on another day than their one before it opens with its day, the prompt stays a
byte-identical extension of the previous one between folds (the new message is dated as the
window will show it next time), and a chapter asked for on its own sees the same days."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.config import LLMConfig, RetrievalConfig, SummaryConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import ChatMessage
from bot.llm.tokens import make_counter
from bot.memory.chapter_text import CONTINUATION_MARK, fold_input
from bot.memory.context import ContextBuilder
from bot.memory.retrieval import Retriever
from bot.memory.store import SqliteStore, StoredMessage
from bot.memory.summary import FoldBase, Summarizer
from bot.memory.window import date_lines, group_turns
from tests.fakes.fake_llm import FakeLLM

COUNTER = make_counter()
DAY = 86400.0
T0 = datetime(2023, 5, 8, 10, 0, tzinfo=UTC).timestamp()


def _builder(store: SqliteStore) -> ContextBuilder:
    return ContextBuilder(
        store=store,
        retriever=Retriever(store=store, counter=COUNTER, config=RetrievalConfig()),
        counter=COUNTER,
        system_prompt="You are a test bot.",
        retrieval_share=0.2,
        wall=lambda: T0 + 2 * DAY,
    )


async def _say(store: SqliteStore, conv_id: int, text: str, at: float) -> int:
    return await store.add_message(
        conv_id, role="user", author="alice", text=text, tokens=COUNTER.count(text),
        status="answered", created_at=at,
    )  # fmt: skip


async def _answer(store: SqliteStore, conv_id: int, text: str, at: float, parent: int) -> None:
    await store.add_message(
        conv_id, role="assistant", author="bot", text=text, tokens=COUNTER.count(text),
        status="delivered", created_at=at, parent_id=parent,
    )  # fmt: skip


async def test_a_turn_on_a_new_day_opens_with_its_date_and_the_prompt_only_grows(
    store: SqliteStore,
) -> None:
    conv = await store.conversation(ConversationKey("console", "alice"))
    first = await _say(store, conv.id, "I planted the tomatoes today.", T0)
    await _answer(store, conv.id, "Good luck with them.", T0 + 60, first)
    second = await _say(store, conv.id, "The cat knocked one over.", T0 + 600)
    await _answer(store, conv.id, "Oh no.", T0 + 660, second)
    # The next morning: a new day.
    new = await _say(store, conv.id, "They survived the night.", T0 + DAY)
    before = await _builder(store).build(
        conv, new_text="They survived the night.", new_message_id=new, budget=1500
    )
    user = [m.content for m in before.messages if m.role == "user"]
    assert user[0] == "[8 May 2023]\nI planted the tomatoes today."
    assert user[1] == "The cat knocked one over."  # the same day: no line
    assert user[2] == "[9 May 2023]\nThey survived the night."  # the final message
    await _answer(store, conv.id, "Great news.", T0 + DAY + 60, new)
    later = await _say(store, conv.id, "And the basil too.", T0 + DAY + 120)
    after = await _builder(store).build(
        conv, new_text="And the basil too.", new_message_id=later, budget=1500
    )
    # Byte-identical up to the end of the previous prompt's final message, then it grows.
    assert after.messages[: len(before.messages)] == before.messages
    assert after.messages[-1].content == "And the basil too."  # the same day again
    # Not what the wall clock says: the day the message was stored (a replay, a restart).
    assert "[10 May 2023]" not in "\n".join(m.content for m in after.messages)


async def test_date_lines_mark_the_first_turn_and_each_change_of_day() -> None:
    def msg(i: int, role: str, at: float) -> StoredMessage:
        return StoredMessage(
            id=i, conversation_id=1, role=role, author="alice" if role == "user" else "bot",
            text=f"m{i}", created_at=at, tokens=2, platform_id=None, parent_id=None,
            status="answered",
        )  # fmt: skip

    log = [
        msg(1, "user", T0), msg(2, "assistant", T0 + 1), msg(3, "user", T0 + 2),
        msg(4, "assistant", T0 + DAY), msg(5, "user", T0 + DAY + 5),
        msg(6, "user", T0 + 3 * DAY),
    ]  # fmt: skip
    dates = date_lines(group_turns(log))
    # The person's messages: an answer the next day dates nothing; a message after a day
    # without answers (the same turn) is dated.
    assert dates == {1: "[8 May 2023]", 5: "[9 May 2023]", 6: "[11 May 2023]"}
    material = fold_input("", log)
    assert material.splitlines()[3:] == [
        "[8 May 2023]", "alice: m1", "bot: m2", "alice: m3", "bot: m4",
        "[9 May 2023]", "alice: m5", "[11 May 2023]", "alice: m6",
    ]  # fmt: skip


async def test_a_continuation_fold_is_the_dated_reply_prompt_byte_for_byte(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    """The chapter a fold writes as a continuation reads the same date lines the reply did."""
    conv = await store.conversation(ConversationKey("console", "alice"))
    ids = []
    for day in range(3):  # three days, two exchanges a day
        for k in range(2):
            at = T0 + day * DAY + k * 600
            said = await _say(store, conv.id, f"Day {day} note {k}: the boat needs paint.", at)
            await _answer(store, conv.id, f"Noted, day {day}.", at + 60, said)
            ids.append(said)
    new = await _say(store, conv.id, "What did I say about the boat?", T0 + 3 * DAY)
    ctx = await _builder(store).build(
        conv, new_text="What did I say about the boat?", new_message_id=new, budget=1500
    )
    base = FoldBase((*ctx.messages, ChatMessage("assistant", "You said it needs paint.")), ids[0])
    llm = OpenAICompatLLM(
        config=LLMConfig.model_validate({"base_url": fake_llm.base_url, "model": "m"}), env={}
    )
    summ = Summarizer(store=store, llm=llm, counter=COUNTER, config=SummaryConfig(min_evicted=6))
    fake_llm.reply = "On 8 May 2023 Alice said the boat needs paint."
    assert summ.maybe_schedule(conv, window_start_id=ids[4], base=base)
    await summ.wait_quiet()
    await llm.close()
    sent = fake_llm.chat_requests()[0]["messages"]
    assert sent[:-1] == [{"role": m.role, "content": m.content} for m in base.messages]
    assert sent[-1]["content"].startswith(CONTINUATION_MARK)
    shown = "\n".join(m["content"] for m in sent)
    for line in ("[8 May 2023]", "[9 May 2023]", "[10 May 2023]", "[11 May 2023]"):
        assert shown.count(line) == 1  # each day once, where it begins
