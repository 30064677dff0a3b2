"""What a model writes is kept only when grounded in the turns it covers (issue 37): sentence
by sentence, no name, number or place neither side said, no copy of the bot's answer; the
digest prefers the person's lines; titles are cut at a word; the person's plain statements
are facts whatever the model answers, with provenance, and ``!forget`` deletes them."""

from __future__ import annotations

import json

from bot.config import LLMConfig
from bot.domain import ConversationKey
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.tokens import make_counter
from bot.memory import chapter_check, grounding, plain_facts
from bot.memory.chapter_text import CHAPTER_PROMPT
from bot.memory.facts import FactExtractor, grounded
from bot.memory.grounding import Line
from bot.memory.sessions import TITLE_MAX_CHARS, parse_session_summary
from bot.memory.store import SqliteStore
from tests.fakes.fake_llm import FakeLLM

KEY = ConversationKey("console", "ana")
BOT_ANSWER = (
    "Biscuit sounds like a wonderful companion, beagles are curious and friendly dogs that "
    "love long walks and sniffing everything around the neighbourhood."
)
TURNS = [
    Line("ana", "My dog is called Biscuit, she is a three year old beagle.", True),
    Line("bot", BOT_ANSWER, False),
    Line("ana", "My door code is 4521.", True),
    Line("bot", "Remember to keep your door code private and change it now and then.", False),
]


def test_invented_names_numbers_and_places_are_not_grounded() -> None:
    said = grounding.said(TURNS)
    assert grounding.sentence_problem("Ana's dog Biscuit is a three year old beagle.", said) is None
    assert grounding.sentence_problem("The door code is 4521.", said) is None
    for invented in (
        "Ana took Biscuit to the Sydney Opera House.",  # a place nobody said
        "The door code is 9981.",  # a number nobody said
        "The person you're referring to is Maria.",  # a name nobody said
        "She stays at Biscuzzle's Hotel.",
    ):
        assert grounding.sentence_problem(invented, said) is not None, invented
    # A text keeps its grounded sentences only; mostly invented, it is refused whole.
    mixed = "Ana's dog is Biscuit, a beagle. The door code is 4521. They met Maria in Sydney."
    assert grounding.keep(mixed, said) == "Ana's dog is Biscuit, a beagle. The door code is 4521."
    assert grounding.keep("Maria lives in Sydney. They met in 2019 at the Opera.", said) is None


def test_a_copy_of_the_bots_answer_is_no_chapter() -> None:
    why = chapter_check.problem(BOT_ANSWER, instruction=CHAPTER_PROMPT, sources=TURNS)
    assert why is not None and "copies the bot's answer" in why
    text = chapter_check.vet(BOT_ANSWER, instruction=CHAPTER_PROMPT, sources=TURNS,
                             counter=make_counter(), limit=40)  # fmt: skip
    assert text.startswith(chapter_check.DIGEST_MARK)


def test_the_digest_prefers_what_the_person_said() -> None:
    counter = make_counter()
    text = chapter_check.digest(TURNS, counter=counter, limit=40)
    assert "ana: My dog is called Biscuit, she is a three year old beagle." in text
    assert "ana: My door code is 4521." in text
    assert "curious and friendly" not in text  # the bot's long line had the rarer words
    assert chapter_check.best_sentence(TURNS).startswith("My dog is called Biscuit")


def test_a_long_title_is_cut_at_a_word_boundary() -> None:
    answer = ("The person you're referring to is Maria. She loves Lisbon so much, and she always "
              "goes there\nThey talked.")  # fmt: skip
    title, _ = parse_session_summary(answer)
    assert len(title) <= TITLE_MAX_CHARS and title.endswith("…")
    assert answer.startswith(title.removesuffix("…"))
    assert answer[len(title) - 1] == " "  # the cut fell between two words


def test_plain_first_person_statements() -> None:
    cases = {
        "my door code is 4521": ["Their door code is 4521."],
        "My dog is called Biscuit, she is a beagle.": [
            "Their dog is called Biscuit, she is a beagle."
        ],
        "I live in Lisbon.": ["They live in Lisbon."],
        "I'm allergic to penicillin": ["They are allergic to penicillin."],
        "my name is Ana and I play the cello": ["Their name is Ana.", "They play the cello."],
        "Is my door code 4521?": [],  # a question
        "my door code is not 4521": [],  # negated
        "if my dog is sick I stay home": [],  # conditional
        "oh my god it is hot": [],
        "I'm going to bed": [],  # a plan names a place or a day
    }
    for text, facts in cases.items():
        assert plain_facts.statements(text) == facts, text


async def test_plain_facts_are_kept_when_the_model_extracts_none_and_forget_deletes_them(
    store: SqliteStore, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = json.dumps({"facts": [{"op": "add", "text": "The door code is 9981"}]})
    cfg = LLMConfig.model_validate({"base_url": fake_llm.base_url, "model": "m", "retries": 0})
    llm = OpenAICompatLLM(config=cfg, env={})
    extractor = FactExtractor(store=store, llm=llm, counter=make_counter(), max_facts=20)
    conv = await store.conversation(KEY)
    said = ["Hello!", "My door code is 4521.", "I'm allergic to penicillin."]
    ids = [
        await store.add_message(conv.id, role="user", author="ana", text=t, tokens=5, status="x")
        for t in said
    ]
    try:
        await extractor.extract(conv.id, await store.all_messages(conv.id))
    finally:
        await llm.close()
    facts = await store.facts(conv.id)
    assert [(f.text, f.source_ids, f.pinned) for f in facts] == [
        ("Their door code is 4521.", (ids[1],), False),
        ("They are allergic to penicillin.", (ids[2],), False),
    ]  # the model's invented code was refused
    assert grounded("The door code is 9981", await store.all_messages(conv.id)) is None
    await store.forget_person(KEY.transport, KEY.person)
    assert await store.facts((await store.conversation(KEY)).id) == []


def test_a_chapter_written_without_the_model_quotes_the_persons_facts_first() -> None:
    from bot.memory.chapter_text import own_lines
    from bot.memory.records import StoredMessage

    said = ["Hi there! How are you today?", "The weather has been nice this week.",
            "My door code is 4521.", "Tell me a short joke.", "I had soup for lunch."]  # fmt: skip
    messages = [
        StoredMessage(i + 1, 1, "user" if i % 2 == 0 else "assistant",
                      "ana" if i % 2 == 0 else "bot",
                      said[i // 2] if i % 2 == 0 else BOT_ANSWER, 0.0, 10, None, None, "x")
        for i in range(2 * len(said))
    ]  # fmt: skip
    text = own_lines(messages, 12, make_counter())
    assert "ana: My door code is 4521." in text  # not the first words of the block
    assert "Hi there" not in text and "curious" not in text


def test_a_title_that_is_only_a_date_line_gives_way_to_the_persons_words() -> None:
    from bot.memory.records import StoredMessage
    from bot.memory.sessions import grounded_summary
    from bot.memory.window import day_line

    said = StoredMessage(1, 1, "user", "ana", "My door code is 4521.", 1.7e9, 8, None, None, "x")
    title, _ = grounded_summary(
        f"{day_line(said.created_at)}\nThey talked.", [said], make_counter()
    )
    assert title == "My door code is 4521."
