"""Facts from a whole session (issue 21 point 5): extraction reads a long session in chunks,
so "home is Oslo" as message 1 of 70 becomes a fact; a summary fold extracts facts too, not
only a session close; an inferred fact reaches the model marked as inferred; ``!facts`` says
when and from what. All through the real app and the real openai client."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from bot.domain import ConversationKey
from bot.memory.facts import INFERRED, MAX_INPUT_MESSAGES
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.memory_script import MemoryScript


class OsloScript(MemoryScript):
    """Extraction proposes "Lives in Oslo" only when the message saying it is shown."""

    def __call__(self, body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if system.startswith("You keep a short list of durable facts"):
            self.seen.append("facts")
            shown = body["messages"][1]["content"]
            found = re.search(r"\[(\d+)\] alice: home is Oslo", shown)
            if found and "Lives in Oslo" not in shown:
                return json.dumps({"facts": [{"op": "add", "text": "Lives in Oslo",
                                              "source": [int(found.group(1))]}]})  # fmt: skip
            return '{"facts": []}'
        return super().__call__(body)


async def test_a_fact_said_first_in_a_long_session_is_extracted(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    script = OsloScript()
    fake_llm.reply_fn = script
    h = await start_harness(tmp_path, fake_llm)
    try:
        conv = await h.store.conversation(h.transport_key("alice"))
        start = time.time() - 10 * 3600
        first = 0
        for i in range(70):  # message 1 of 70 says it; the session closed long ago
            text = "home is Oslo" if i == 0 else f"chat line {i}"
            mid = await h.store.add_message(
                conv.id, role="user" if i % 2 == 0 else "assistant",
                author="alice" if i % 2 == 0 else "bot", text=text, tokens=3,
                status="answered", created_at=start + i,
            )  # fmt: skip
            first = first or mid
        assert h.app.sessions is not None
        await h.app.sessions.tick()
        [fact] = await h.store.facts(conv.id)
        assert (fact.text, fact.source_ids, fact.pinned) == ("Lives in Oslo", (first,), False)
        assert script.seen.count("facts") == -(-70 // MAX_INPUT_MESSAGES)  # every chunk read
        # the model sees it as inferred, not as a note the person asked to keep
        await h.say("where do I live?", sender="alice")
        prompt = json.dumps(fake_llm.chat_requests()[-1]["messages"])
        assert f"Lives in Oslo{INFERRED}" in prompt
        # !facts says when and from what
        await h.say("!facts", sender="alice")
        listing = h.transport.texts()[-1]
        assert 'inferred today from "home is Oslo"' in listing, listing
        await h.say("!remember I sail on weekends", sender="alice")
        await h.say("!facts", sender="alice")
        assert "[you, today]" in h.transport.texts()[-1]
    finally:
        await h.app.close()


async def test_a_summary_fold_extracts_facts_before_the_session_closes(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Issue 17 point 4 (extraction part): folding old turns into a chapter also reads them
    for facts, so a long live session gains its facts without waiting for its close."""
    from bot.config import LLMConfig, SummaryConfig
    from bot.llm.openai_compat import OpenAICompatLLM
    from bot.llm.tokens import make_counter
    from bot.memory.facts import FactExtractor
    from bot.memory.store import SqliteStore
    from bot.memory.summary import Summarizer

    script = OsloScript()
    fake_llm.reply_fn = script
    store = await SqliteStore.open(tmp_path / "m.db")
    llm = OpenAICompatLLM(
        config=LLMConfig.model_validate({"base_url": fake_llm.base_url, "model": "m",
                                         "retries": 0}), env={},
    )  # fmt: skip
    try:
        counter = make_counter()
        extractor = FactExtractor(store=store, llm=llm, counter=counter, max_facts=20)
        summarizer = Summarizer(store=store, llm=llm, counter=counter, config=SummaryConfig(),
                                extractor=extractor)  # fmt: skip
        conv = await store.conversation(ConversationKey("console", "alice"))
        ids = [
            await store.add_message(
                conv.id,
                role="user" if i % 2 == 0 else "assistant",
                author="alice" if i % 2 == 0 else "bot",
                text="home is Oslo" if i == 0 else f"line {i}",
                tokens=3,
                status="answered",
            )
            for i in range(12)
        ]
        assert await summarizer.refresh(conv, window_start_id=ids[8])
        assert len(await store.summaries(conv)) == 1
        await summarizer.wait_quiet()  # facts are read in their own task after the chapter
        assert [f.text for f in await store.facts(conv.id)] == ["Lives in Oslo"]
        assert await store.sessions(conv.id) == []  # no session has closed
    finally:
        await llm.close()
        await store.close()
