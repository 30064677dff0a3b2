"""A small model cannot spoil the memory (issue 37): ``bench.ten_facts``' forty turns against
the fake server, which writes what SmolLM2-135M wrote in the field: chapters, a session title
and summary and facts about things nobody said ("the Sydney Opera House", "Biscuzzle's
Hotel", "Maria"), and a chapter that copies one of the bot's answers. None of it is kept; the
facts the person stated plainly are, and they are in the prompt at turn 40."""

from __future__ import annotations

import json
from typing import Any

from bench.prefix import is_reply
from bench.ten_facts import FACTS, Report, render, run
from bot.memory.chapter_text import CHAPTER_PROMPT, CONTINUATION_MARK, MERGE_PROMPT
from bot.memory.facts import PROMPT as FACTS_PROMPT
from bot.memory.sessions import LONGTERM_PROMPT, SESSION_PROMPT
from tests.fakes.fake_llm import FakeLLM

COPIED = "Walks by the river are lovely in the spring, and a beagle loves them too."
INVENTED_CHAPTER = "The person visited the Sydney Opera House with Maria in 2019."
INVENTED_TITLE = "The person you're referring to is Maria. She loves Lisbon so much, and she always"
INVENTED_SUMMARY = (
    "This chat session was edited by me with no pre-defined format on a virtual reality platform."
)
INVENTED_FACTS = [
    {"op": "add", "text": "The person's hotel is Biscuzzle's Hotel."},
    {"op": "add", "text": "The person's door code is 9981."},
    {"op": "add", "text": "The person lives in Sydney."},
]


class Hallucinating:
    """The fake server as a tiny model: replies that are harmless, memory that is invented."""

    def __init__(self) -> None:
        self.chapters = 0
        self.kinds: list[str] = []

    def __call__(self, body: dict[str, Any]) -> str:
        messages = body["messages"]
        system, last = str(messages[0]["content"]), str(messages[-1]["content"])
        if last.startswith(CONTINUATION_MARK) or system.startswith((CHAPTER_PROMPT, MERGE_PROMPT)):
            self.chapters += 1
            self.kinds.append("chapter")
            return COPIED if self.chapters % 2 else INVENTED_CHAPTER
        if system.startswith(SESSION_PROMPT):
            self.kinds.append("session")
            return f"{INVENTED_TITLE}\n{INVENTED_SUMMARY}"
        if system.startswith(FACTS_PROMPT[:40]):
            self.kinds.append("facts")
            return json.dumps({"facts": INVENTED_FACTS})
        if system.startswith(LONGTERM_PROMPT[:40]):
            self.kinds.append("longterm")
            return "The person lives in Sydney and plays the violin at the Opera House."
        assert is_reply(body)
        self.kinds.append("reply")
        return COPIED if "walks" in last.lower() else "I see, tell me more."


async def test_invented_memory_is_refused_and_plain_facts_reach_turn_40(fake_llm: FakeLLM) -> None:
    script = Hallucinating()
    fake_llm.reply_fn = script
    report: Report = await run(fake_llm.base_url, "fake", log=lambda _: None, prompt_speed=1e6)
    print(render(report))
    assert report.replies == 40
    assert {"chapter", "session", "facts", "longterm"} <= set(script.kinds)  # all were asked
    texts = [text for _, text in report.stored]
    assert report.invented == [], report.invented  # nothing nobody said is stored
    assert not any(COPIED in t and not t.startswith("(quoted)") for t in texts)  # no copy
    assert not any(INVENTED_TITLE[:40] in t or "virtual reality" in t for t in texts)
    facts = [text for what, text in report.stored if what == "fact"]
    for plain in ("4521", "penicillin", "Biscuit", "Lisbon", "cello", "Aurora"):
        assert any(plain in f for f in facts), (plain, facts)
    assert len(report.in_prompt) >= 8, report.missing
    assert len(report.in_prompt) + len(report.missing) == len(FACTS)
