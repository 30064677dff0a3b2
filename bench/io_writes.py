"""Bytes a running bot writes: per turn and per idle minute (issue 43). Not a test.

Starts the fake TCP radio (tests/fakes/fake_radio.py; the unmodified meshtastic library talks
to it) and the fake LLM server (tests/fakes/fake_llm.py) in this process, then the real
``meshsage run`` in a child process (``--code DIR`` runs another checkout's bot/ with this
interpreter, for a before/after comparison) with its state directory on the disk under
``--dir`` (default: the system temp dir; it must not be a tmpfs, which counts no writes).

One person sends ``--turns`` questions one after another (the next when the answer is on the
radio); then the bot is left alone for ``--idle`` minutes. From ``/proc/<pid>/io`` of the bot:
``write_bytes`` (bytes the process caused to be written to the storage layer: SQLite pages,
its WAL, the status file; page-granular) and ``syscw`` (write system calls of any kind:
files, sockets, pipes), per turn and per idle minute. The idle window starts ``--settle``
seconds after the last answer (background summaries and the index catch up first).

``--runtime-dir DIR`` sets ``RUNTIME_DIRECTORY`` for the bot, as systemd's
``RuntimeDirectory=meshsage`` does (point it at a tmpfs such as /dev/shm to measure the
systemd setup); ``--session-dir DIR`` sets ``XDG_RUNTIME_DIR``, as a login session does for a
bot started by hand (logind's /run/user/<uid>, a tmpfs: point it at one). The default measures
a bot started with neither (cron, a bare container), everything on the disk.

It prints what it measured and writes nothing else.
Usage: python -m bench.io_writes [--turns 50] [--idle 3] [--code /other/checkout]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE, FakeTcpRadio

ROOT = Path(__file__).resolve().parents[1]
READY_LINE = "transport meshtastic launched"
ANSWER = (
    "Rain later today, about 5 mm after three; take a jacket if you go out this afternoon, "
    "and the wind drops by evening."
)
TOPICS = ("weather", "tides", "the trail", "the market", "the bus", "the river", "the pass")


def io_counters(pid: int) -> dict[str, int]:
    """``/proc/<pid>/io`` as numbers (write_bytes, syscw, ...)."""
    out = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, value = line.split(":")
        out[key.strip()] = int(value)
    return out


class _LLMThread:
    """The fake LLM server on its own event loop, in a daemon thread."""

    def __init__(self) -> None:
        self.llm = FakeLLM()
        self.llm.reply = ANSWER
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self.llm.start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True, name="fake-llm").start()
        ready.wait(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.llm.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


def _wait(cond: object, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if callable(cond) and cond():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def one_run(args: argparse.Namespace, llm_url: str) -> dict[str, float]:
    radio = FakeTcpRadio()
    base = Path(args.dir) if args.dir else None
    with tempfile.TemporaryDirectory(dir=base, prefix="io_writes.") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            f"llm: {{base_url: '{llm_url}', model: fake, retries: 0}}\n"
            "bot:\n  rate_limit: {messages: 1000, per_seconds: 60}\n"
            f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}, "
            "cooldown: 0, spacing_seconds: 2.1}\n"
        )
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": tmp,
            "PYTHONPATH": str(args.code),
            "MESHSAGE_STATE_DIR": str(Path(tmp) / "state"),
            "MESHSAGE_CONFIG": str(config),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        runtime = (
            Path(args.runtime_dir) / f"meshsage-bench-{os.getpid()}" if args.runtime_dir else None
        )
        if runtime is not None:
            runtime.mkdir(mode=0o700, exist_ok=True)
            env["RUNTIME_DIRECTORY"] = str(runtime)
        session = (
            Path(args.session_dir) / f"meshsage-bench-session-{os.getpid()}"
            if args.session_dir
            else None
        )
        if session is not None:
            session.mkdir(mode=0o700, exist_ok=True)
            env["XDG_RUNTIME_DIR"] = str(session)
        cmd = [sys.executable, "-m", "bot.cli", "run", "--config", str(config)]
        if args.strace:
            trace = "trace=write,pwrite64,fsync,fdatasync,rename,openat,unlink"
            cmd = ["strace", "-f", "-o", args.strace, "-e", trace, *cmd]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, cwd=tmp, text=True,
        )  # fmt: skip
        assert proc.stderr is not None
        pid = proc.pid
        try:
            for line in proc.stderr:
                if READY_LINE in line:
                    break
            else:
                raise RuntimeError("meshsage ended before its transport started")
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            pid = _bot_pid(proc.pid) if args.strace else proc.pid
            _wait(lambda: radio.connections > 0, 60, "the radio link")
            time.sleep(args.settle)  # startup's own writes (migrations, first status) end
            before = io_counters(pid)
            for i in range(args.turns):
                shown = len(radio.shown)
                topic = TOPICS[i % len(TOPICS)]
                radio.inject_text(f"question {i + 1}: what about {topic} today?", frm=ALICE)
                _wait(lambda n=shown: len(radio.shown) > n, 120, f"answer {i + 1}")
            time.sleep(1.0)  # the last ACK recorded
            after_turns = io_counters(pid)
            time.sleep(args.settle)
            idle_start = io_counters(pid)
            time.sleep(args.idle * 60)
            idle_end = io_counters(pid)
            rss = _rss_mb(pid)
        finally:
            os.kill(pid, signal.SIGTERM)  # the bot itself (under strace: its child)
            proc.wait(60)
            radio.stop()
            if runtime is not None:
                shutil.rmtree(runtime, ignore_errors=True)

    def per(a: dict[str, int], b: dict[str, int], key: str, n: float) -> float:
        return (b[key] - a[key]) / n

    return {
        "turn_bytes": per(before, after_turns, "write_bytes", args.turns),
        "turn_syscw": per(before, after_turns, "syscw", args.turns),
        "idle_bytes": per(idle_start, idle_end, "write_bytes", args.idle),
        "idle_syscw": per(idle_start, idle_end, "syscw", args.idle),
        "rss_mb": rss,
    }


def _bot_pid(strace_pid: int) -> int:
    """The bot's pid under strace: its child."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        kids = Path(f"/proc/{strace_pid}/task/{strace_pid}/children").read_text().split()
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    raise RuntimeError("no child under strace")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.io_writes", description=__doc__)
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--idle", type=float, default=3.0, help="idle minutes measured")
    p.add_argument("--settle", type=float, default=15.0, help="seconds before each window")
    p.add_argument("--code", type=Path, default=ROOT, help="checkout whose bot/ to run")
    p.add_argument("--dir", default="", help="where the state dir goes (a disk, not tmpfs)")
    p.add_argument("--runtime-dir", default="", help="RUNTIME_DIRECTORY parent (a tmpfs)")
    p.add_argument("--session-dir", default="", help="XDG_RUNTIME_DIR parent (a tmpfs)")
    p.add_argument("--strace", default="", metavar="FILE", help="run the bot under strace")
    args = p.parse_args(argv)
    server = _LLMThread()
    try:
        r = one_run(args, server.llm.base_url)
    finally:
        server.stop()
    where = f", RUNTIME_DIRECTORY under {args.runtime_dir}" if args.runtime_dir else ""
    print(
        f"code {args.code}{where}: {args.turns} turns, one person, Python "
        f"{sys.version.split()[0]}\n"
        f"  per turn:        {r['turn_bytes']:,.0f} B written (write_bytes), "
        f"{r['turn_syscw']:.0f} write syscalls\n"
        f"  per idle minute: {r['idle_bytes']:,.0f} B written, {r['idle_syscw']:.0f} write "
        f"syscalls (over {args.idle:g} min)\n"
        f"  RSS at the end:  {r['rss_mb']:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
