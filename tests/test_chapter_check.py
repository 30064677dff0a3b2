"""Nothing junk is kept as a chapter: an echoed instruction, the prompt's scaffolding or words
not in the turns are replaced by a digest of the turns' own sentences, and ``!summary`` never
shows an instruction (even one stored before the check existed)."""

from __future__ import annotations

from bot.config import LLMConfig, SummaryConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.tokens import make_counter
from bot.memory import chapter_check
from bot.memory.chapter_text import CHAPTER_PROMPT, MERGE_PROMPT
from bot.memory.store import SqliteStore
from bot.memory.summary import Summarizer
from tests.conftest import Harness
from tests.fakes.fake_llm import FakeLLM

TURNS = [
    ("ana", "Hi there."),
    ("bot", "Hello! How can I help?"),
    ("ana", "My door code is 4521. The gate is at the north side of Porto harbour."),
    ("bot", "Noted, 4521 at the north gate."),
    ("ana", "ok thanks"),
    ("ana", "On 12 March I fly to Lisbon with Maria."),
]
KEY = ConversationKey("console", "ana")


def test_an_echoed_instruction_is_rejected() -> None:
    echo = CHAPTER_PROMPT.format(words=60)
    why = chapter_check.problem(echo, instruction=CHAPTER_PROMPT, sources=TURNS)
    assert why == "it echoes its instruction"
    part = "You summarize one stretch of a chat between a person and an assistant, as a chapter"
    assert chapter_check.problem(part, instruction=CHAPTER_PROMPT, sources=TURNS) is not None


def test_scaffolding_and_unrelated_words_are_rejected() -> None:
    scaffold = "Earlier chapter (context only): (none yet) New messages: ana: Hi there."
    assert chapter_check.problem(scaffold, instruction=CHAPTER_PROMPT, sources=TURNS) == (
        "it repeats the prompt"
    )
    unrelated = "The weather in Tokyo was sunny and the stock market rose sharply today."
    why = chapter_check.problem(unrelated, instruction=CHAPTER_PROMPT, sources=TURNS)
    assert why is not None and "content words are in the turns" in why
    assert chapter_check.problem("", instruction=CHAPTER_PROMPT, sources=TURNS) is not None


def test_a_real_summary_passes() -> None:
    good = "Ana's door code is 4521 (north gate, Porto harbour). She flies to Lisbon on 12 March."
    assert chapter_check.problem(good, instruction=CHAPTER_PROMPT, sources=TURNS) is None
    merged = "Ana's door code is 4521; she flies to Lisbon with Maria on 12 March."
    chapters = [("", "Door code 4521 at the north gate."), ("", "Lisbon with Maria, 12 March.")]
    assert chapter_check.problem(merged, instruction=MERGE_PROMPT, sources=chapters) is None


def test_the_digest_quotes_the_most_informative_sentences_verbatim_within_the_limit() -> None:
    counter = make_counter()
    text = chapter_check.digest(TURNS, counter=counter, limit=45)
    assert text.startswith(chapter_check.DIGEST_MARK)
    assert counter.count(text) <= 45
    assert "ana: My door code is 4521." in text
    assert "ana: On 12 March I fly to Lisbon with Maria." in text
    assert "ok thanks" not in text and "Hi there" not in text
    # In the turns' order, each sentence whole.
    assert text.index("4521") < text.index("Lisbon")
    tiny = chapter_check.digest(TURNS, counter=counter, limit=8)
    assert 0 < counter.count(tiny) <= 8 and tiny.endswith("…")
    assert chapter_check.vet("ok", instruction=CHAPTER_PROMPT, sources=[("a", "ok")],
                             counter=counter, limit=40) == chapter_check.SMALL_TALK  # fmt: skip


async def test_a_fold_whose_answer_echoes_the_instruction_stores_a_digest(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    conv = await store.conversation(KEY)
    ids = [
        await store.add_message(conv.id, role="user" if who == "ana" else "assistant",
                                author=who, text=text, tokens=12, status="x")
        for who, text in TURNS * 2
    ]  # fmt: skip
    llm = OpenAICompatLLM(
        config=LLMConfig.model_validate({"base_url": fake_llm.base_url, "model": "m"}), env={}
    )
    summ = Summarizer(store=store, llm=llm, counter=make_counter(),
                      config=SummaryConfig(min_evicted=4))  # fmt: skip
    fake_llm.reply = CHAPTER_PROMPT.format(words=30)  # what SmolLM2-135M answered
    try:
        assert await summ.refresh(conv, window_start_id=ids[6])
    finally:
        await llm.close()
    [chapter] = await store.summaries(conv)
    assert chapter.text.startswith(chapter_check.DIGEST_MARK)
    assert "You summarize" not in chapter.text and "4521" in chapter.text
    assert (chapter.first_message_id, chapter.last_message_id) == (ids[0], ids[5])


async def test_summary_command_never_shows_an_instruction(harness: Harness) -> None:
    await harness.say("my door code is 4521")
    conv = await harness.store.conversation(harness.transport_key("alice"))
    echo = CHAPTER_PROMPT.format(words=40)
    await harness.store.save_summary(conv.id, text=echo, first_message_id=conv.reset_after + 1,
                                     last_message_id=conv.reset_after + 1, tokens=60)  # fmt: skip
    await harness.say("!summary")
    assert harness.transport.texts()[-1] == "No summary yet: our conversation is still short."
    await harness.store.save_summary(conv.id, text="Alice's door code is 4521.",
                                     first_message_id=conv.reset_after + 2,
                                     last_message_id=conv.reset_after + 2, tokens=8)  # fmt: skip
    await harness.say("!summary")
    assert harness.transport.texts()[-1] == "Summary: Alice's door code is 4521."
