"""No unmeasured background prompt blocks a person (issue 37, point 3).

Measured on a real llama-cpp-python server with SmolLM2: a fresh start ran a pending session
close at once (a 3,637-token summary prompt: the gate assumed "until a rate is known, a
background call fits"), and the first message, typed 20 s in, waited 38.3 s for a reply whose
own server time was 1.25 s; an incognito message waited 33.2 s behind a 1,468-token prompt
that started while the person typed four commands in a row. Here the gate meets a server on a
virtual clock that reads 40 prompt tokens a second and cannot stop evaluating, and the whole
app meets the one-slot fake (``OneSlotLLM``) on a scaled clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from bot.domain import DM_SPACE, ConversationKey
from bot.errors import LLMUnavailable
from bot.llm.gate import CHARS_PER_TOKEN, START_FREE, UNMEASURED_TOKENS, LLMGate
from bot.llm.port import ChatMessage, Completion, JsonSchema, OnText
from bot.memory.store import SqliteStore
from tests.conftest import start_harness
from tests.fakes.fake_llm import OneSlotLLM
from tests.fakes.slow_server import SlowServer
from tests.test_one_slot import UNLIMITED, answer, is_background


def _prompt(kind: str, tokens: int) -> list[ChatMessage]:
    return [ChatMessage("user", f"{kind}: " + "word " * int(tokens * CHARS_PER_TOKEN / 5))]


async def _until(predicate: object, *, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.01)


async def test_a_fresh_start_measures_first_and_keeps_a_long_prompt_for_after_the_reply() -> None:
    clock = [0.0]
    server = SlowServer(clock, rate=40.0)
    gate = LLMGate(llm=server, limit=1, clock=lambda: clock[0])
    close = asyncio.create_task(gate.background.complete(_prompt("summary", 3637), max_tokens=9))
    await _until(lambda: server.calls)
    await asyncio.sleep(0.3)  # the gate polls: the long prompt would have been sent by now
    kinds = [kind for kind, _, _ in server.calls]
    assert kinds and set(kinds) == {"probe"}  # measured with small requests, nothing else
    assert all(tokens <= 2 * UNMEASURED_TOKENS for _, tokens, _ in server.calls)
    assert gate.prompt_rate is not None and 30 <= gate.prompt_rate <= 45

    clock[0] = 20.0  # the first message, typed 20 s in
    await gate.foreground.complete(_prompt("reply", 40), max_tokens=9)
    _, reply_tokens, reply_sent = server.calls[-1]
    assert server.calls[-1][0] == "reply"
    assert reply_sent - 20.0 <= START_FREE  # waited for nothing longer than START_FREE
    await asyncio.wait_for(close, 5)  # the session close runs once a reply has ended
    assert [kind for kind, _, _ in server.calls][-2:] == ["reply", "summary"]
    assert gate.probes >= 1 and reply_tokens > 0


async def test_before_any_reply_background_prompts_stay_within_a_few_seconds() -> None:
    clock = [0.0]
    server = SlowServer(clock, rate=40.0)
    gate = LLMGate(llm=server, limit=1, clock=lambda: clock[0])
    await gate.background.complete(_prompt("small", 60), max_tokens=9)  # measured by this one
    assert gate.prompt_rate is not None
    short = _prompt("fold", int(START_FREE * 40 * 0.5))
    long = _prompt("fold", int(START_FREE * 40 * 4))
    assert gate.fits(short, max_tokens=9)
    assert not gate.fits(long, max_tokens=9)  # no reply yet: nobody's rhythm is known


async def test_commands_typed_in_a_row_keep_a_long_prompt_out_of_the_gap() -> None:
    clock = [0.0]
    server = SlowServer(clock, rate=40.0)
    commands = [0]
    gate = LLMGate(llm=server, limit=1, clock=lambda: clock[0], activity=lambda: commands[0])
    for _ in range(3):  # a person who writes 6 s after each answer
        await gate.foreground.complete(_prompt("reply", 60), max_tokens=9)
        clock[0] += 6.0
    long = _prompt("standalone", 1468)  # 37 s at 40 tokens a second
    assert not gate.fits(long, max_tokens=9)
    for _ in range(4):  # then four commands, 6 s apart: no LLM call, but a person at work
        clock[0] += 6.0
        commands[0] += 2  # a command starts and ends
        gate.expected_free()  # the waiting background call looks every BUSY_POLL
    clock[0] += 3.0
    assert not gate.fits(long, max_tokens=9)  # 27 s since the last answer, 3 s since a command
    assert gate.expected_free() <= 6.0
    clock[0] += 60.0  # the person has gone: the quiet outlasts every gap by far
    assert gate.fits(long, max_tokens=9)


async def test_a_session_closed_at_start_does_not_hold_the_first_message(tmp_path: Path) -> None:
    """The whole app on the one-slot fake (40 prompt tokens a second, scaled clock): a session
    of alice's closed long ago waits for its summary; bob writes 20 s after the start and waits
    at most START_FREE seconds behind background work (today: the whole summary prompt)."""
    scale = 0.25
    fake = OneSlotLLM(prompt_rate=40.0, gen_rate=20.0, scale=scale, is_background=is_background)
    fake.reply_fn = answer
    await fake.start()
    store = await SqliteStore.open(tmp_path / "state" / "meshsage.db")
    conv = await store.conversation(ConversationKey("fake", "alice", DM_SPACE))
    old = time.time() - 10 * 3600
    for i in range(24):  # about 1,500 tokens: 40 s of evaluation at 40 tokens/s
        await store.add_message(
            conv.id, role="user" if i % 2 == 0 else "assistant", author="alice",
            text=f"message {i}: " + "we talked about the garden, the river and the hills " * 5,
            tokens=60, status="answered", created_at=old + i,
        )  # fmt: skip
    await store.close()
    h = await start_harness(tmp_path, fake, extra=UNLIMITED)
    try:
        await fake.sleep(20.0)
        await h.say("hello, what is a good first radio?", sender="bob")
        [reply] = fake.replies()
        waited = fake.waited_behind_background(reply)
        assert waited <= START_FREE / scale + 0.5, (waited, fake.served)
    finally:
        await h.app.close()
        await fake.stop()


class DownServer:
    model_name = "down"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        on_text: OnText | None = None,
        schema: JsonSchema | None = None,
        model: str | None = None,
    ) -> Completion:
        self.calls += 1
        raise LLMUnavailable("no LLM endpoint answered")


async def test_a_server_that_is_down_is_not_measured_again_and_again() -> None:
    server = DownServer()
    gate = LLMGate(llm=server, limit=1)
    waiting = asyncio.create_task(gate.background.complete(_prompt("summary", 800), max_tokens=9))
    await asyncio.sleep(0.5)  # ten polls of the waiting call
    assert server.calls == 1  # one failed measurement, then PROBE_RETRY before the next
    assert not waiting.done()  # the long prompt was never sent unmeasured
    waiting.cancel()
