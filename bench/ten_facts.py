"""Ten facts in forty turns: does a small model's memory keep what the person told, and only that?

    python -m bench.ten_facts --base-url http://127.0.0.1:8091/v1 [--model smollm2-135m]

The scripted conversation of issue 37, through meshsage's own pipeline (``bot.app.build``:
responder, layered context, summarizer, gate, session keeper, the OpenAI-compatible adapter
over HTTP), every call to the server at ``--base-url`` (replies and memory alike), at
``context_tokens: 1024`` and ``max_tokens: 120`` with the Meshtastic style hint
(``bench.prefix``). The person tells ten facts (a dog's name and breed, a city, a trip's date
and companion, a hotel, a door code, an instrument, a concert date, an allergy) among small
talk, one message a minute. Reported:
- at turn 40, how many of the ten told facts are in the prompt the bot sends (``FACTS``: each
  fact's words, case-insensitive; target >= 8);
- then the session is closed (the keeper's own tick, the wall clock past ``session_gap``),
  and every stored chapter, session title and summary, long-term summary and fact is read
  back: the names, numbers and places in them that neither side said in the conversation
  (words with a digit, or capitalised past a sentence's first word; target: none).
Printed as measured; nothing is timed for a verdict (the seconds are wall time here).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.e2e_score import invented, said_words
from bench.memory_e2e import ReplayClock, assume_speed, stored_texts, upkeep
from bench.prefix import STYLE_HINT, MeshLikeTransport, bench_config
from bot.app import App, build
from bot.domain import ConversationKey, Inbound, TransportLimits
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import LLM, ChatMessage, Completion
from bot.memory.chapter_text import CONTINUATION_MARK

CONTEXT_TOKENS = 1024
MAX_TOKENS = 120
PERSON = "person"
T0 = datetime(2026, 3, 2, 18, 0, tzinfo=UTC).timestamp()
STEP = 60.0  # seconds between the person's messages
# (fact, the words that must all be in the prompt)
FACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dog's name", ("Biscuit",)),
    ("dog's breed", ("beagle",)),
    ("city", ("Lisbon",)),
    ("trip date", ("14 March",)),
    ("trip companion", ("Teresa",)),
    ("hotel", ("Aurora",)),
    ("door code", ("4521",)),
    ("instrument", ("cello",)),
    ("concert date", ("3 June",)),
    ("allergy", ("penicillin",)),
)
TOLD = {
    2: "My dog is called Biscuit, she is a three year old beagle.",
    6: "I live in Lisbon, close to the river.",
    10: "I'm going to Porto on 14 March with my friend Teresa.",
    14: "We are staying at the Hotel Aurora near the old town.",
    18: "My door code is 4521.",
    22: "I play the cello in a small orchestra.",
    26: "My concert is on 3 June at the town hall.",
    30: "I'm allergic to penicillin.",
}
SMALL_TALK = (
    "Hi there! How are you today?",
    "The weather has been nice this week.",
    "What do you think about coffee in the morning?",
    "Do you like long walks?",
    "I watched a funny film yesterday.",
    "Any tips for sleeping better?",
    "Tell me a short joke.",
    "I had soup for lunch.",
    "Is it better to read in the evening or the morning?",
    "I cleaned the kitchen today.",
    "What is a good name for a houseplant?",
    "Rainy days make me sleepy.",
    "I tried a new tea, it was fine.",
    "How do you stay calm when busy?",
    "I should water the garden.",
    "Do you know any easy recipes?",
    "My neighbour was very loud last night, anyway.",
    "What colour goes with green?",
    "I might bake bread this weekend.",
    "Thanks, that helps.",
    "Do you like music?",
    "I am a bit tired today.",
    "What should I do this evening?",
    "Funny how time flies.",
    "Okay, good to know.",
    "I went for a short run.",
    "Any ideas for a quiet hobby?",
    "That's all for now, I think.",
    "Tell me something nice.",
    "Are you still there?",
    "Let's talk about something else.",
)
LAST = "Can you remind me what I told you about myself?"


def script() -> list[str]:
    """The forty messages: the facts at their turns, small talk between, the question last."""
    talk = iter(SMALL_TALK)
    return [TOLD.get(n) or (LAST if n == 40 else next(talk)) for n in range(1, 41)]


def continued(messages: Sequence[ChatMessage]) -> bool:
    """A fold sent as the continuation of a reply's prompt (it ends with its task)."""
    return messages[-1].content.startswith(CONTINUATION_MARK)


class Recorder:
    """The LLM port, recording the prompt of every reply (a request with the style hint that
    is no fold's continuation)."""

    def __init__(self, inner: LLM) -> None:
        self._inner = inner
        self.replies: list[list[ChatMessage]] = []
        self.memory_calls = 0

    @property
    def model_name(self) -> str:
        return self._inner.model_name

    async def complete(
        self, messages: Sequence[ChatMessage], *, max_tokens: int, **kwargs: Any
    ) -> Completion:
        if messages and STYLE_HINT in messages[0].content and not continued(messages):
            self.replies.append(list(messages))
        else:
            self.memory_calls += 1
        return await self._inner.complete(messages, max_tokens=max_tokens, **kwargs)


@dataclass
class Report:
    in_prompt: list[str] = field(default_factory=list)  # the facts in the turn-40 prompt
    missing: list[str] = field(default_factory=list)
    invented: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (what, text, words)
    stored: list[tuple[str, str]] = field(default_factory=list)  # (what, text) read back
    replies: int = 0
    memory_calls: int = 0
    seconds: float = 0.0


async def run(
    base_url: str, model: str, *, log: Any = print, prompt_speed: float | None = None
) -> Report:
    """The forty turns against ``base_url``, then the session's close; what was measured.
    ``prompt_speed``: the gate takes the server to read this many prompt tokens a second
    (a test's fake on a loaded machine: every fold still asks the model)."""
    report = Report()
    clock = ReplayClock(T0)
    with tempfile.TemporaryDirectory(prefix="meshsage-ten-facts-") as tmp:
        config = bench_config(Path(tmp) / "state", base_url)
        llm_config = config.llm.model_copy(
            update={"model": model, "read_timeout": 900.0, "temperature": 0.0}
        )
        config = config.model_copy(update={"llm": llm_config})
        adapter = OpenAICompatLLM(config=llm_config, env={})
        recorder = Recorder(adapter)
        transport = MeshLikeTransport(max_tokens=MAX_TOKENS)
        transport.limits = TransportLimits(
            context_tokens=CONTEXT_TOKENS, max_tokens=MAX_TOKENS, style_hint=STYLE_HINT
        )
        app = await build(config, env={}, transports=[transport], llm=recorder, wall=clock)
        if prompt_speed is not None:
            assume_speed(app, prompt_speed)
        await app.start()
        if app.sessions is not None:
            await app.sessions.stop()  # its ticks are driven below, at the replay's time
        t0 = time.perf_counter()
        try:
            for n, text in enumerate(script(), 1):
                clock.now = T0 + n * STEP
                inbound = Inbound(transport=transport.name, sender=PERSON, text=text,
                                  message_id=f"m{n}", sender_name=PERSON.title(),
                                  received_at=datetime.fromtimestamp(clock.now, UTC),
                                  authenticated=True)  # fmt: skip
                await transport.inject(inbound)
                await app.responder.wait_idle()
                await app.summarizer.wait_quiet()
                if n % 10 == 0:
                    log(f"  turn {n}: {len(recorder.replies)} replies, "
                        f"{recorder.memory_calls} memory calls, "
                        f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
            report.replies = len(recorder.replies)
            last = "\n".join(m.content for m in recorder.replies[-1]) if recorder.replies else ""
            for name, words in FACTS:
                found = all(w.lower() in last.lower() for w in words)
                (report.in_prompt if found else report.missing).append(name)
            clock.now += app.config.memory.session_gap + 1  # the person went away
            await upkeep(app, log)
            await read_back(app, report)
        finally:
            report.memory_calls = recorder.memory_calls
            report.seconds = time.perf_counter() - t0
            await app.close()
            await adapter.close()
    return report


async def read_back(app: App, report: Report) -> None:
    """Every model-written text the memory holds, and its invented names and numbers."""
    conv = await app.store.conversation(ConversationKey(MeshLikeTransport.name, PERSON))
    report.stored = await stored_texts(app, conv)
    said = said_words(await app.store.all_messages(conv.id))
    for what, text in report.stored:
        new = invented(text, said)
        if new:
            report.invented.append((what, text, new))


def render(report: Report) -> str:
    lines = [
        f"facts told in the turn-40 prompt: {len(report.in_prompt)} of {len(FACTS)} "
        f"(missing: {', '.join(report.missing) or 'none'})",
        f"stored texts with a name, number or place neither side said: "
        f"{len(report.invented)} of {len(report.stored)}",
    ]
    lines += [f"  {what}: {words} in {text[:100]!r}" for what, text, words in report.invented]
    lines.append("stored:")
    lines += [f"  {what}: {text[:140]!r}" for what, text in report.stored]
    lines.append(f"{report.replies} replies, {report.memory_calls} memory calls, "
                 f"{report.seconds:.0f} s wall time")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.ten_facts", description=__doc__.split("\n")[0]
    )
    p.add_argument("--base-url", required=True, help="an OpenAI-compatible server (…/v1)")
    p.add_argument("--model", default="smollm2-135m")
    args = p.parse_args(argv)
    report = asyncio.run(run(args.base_url, args.model))
    print(render(report))


if __name__ == "__main__":
    main()
