"""Interactive console on a real pseudo-terminal: prompt, answer, Ctrl-D quits."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from bot.transports.console import STOPPED
from tests.fakes.fake_llm import FakeLLM


def _read_until(fd: int, marker: bytes, timeout: float = 20.0) -> bytes:
    buf = b""
    deadline = timeout
    while marker not in buf:
        ready, _, _ = select.select([fd], [], [], deadline)
        if not ready:
            raise AssertionError(f"no {marker!r} in {buf!r}")
        try:
            buf += os.read(fd, 4096)
        except OSError:
            break
    return buf


async def test_interactive_chat_on_a_pty(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "Hi from the model"
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), MESHSAGE_LLM_BASE_URL=fake_llm.base_url,
               TIKTOKEN_CACHE_DIR="")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "chat"],
        stdin=slave, stdout=slave, stderr=subprocess.DEVNULL, env=env, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    try:
        loop = asyncio.get_running_loop()
        banner = await loop.run_in_executor(None, _read_until, master, b"you> ")
        assert b"Ctrl-D to quit" in banner
        os.write(master, b"hello\n")
        out = await loop.run_in_executor(None, _read_until, master, b"you> ")
        assert b"meshsage> Hi from the model" in out
        os.write(master, b"\x04")  # Ctrl-D: end of input
        code = await loop.run_in_executor(None, proc.wait, 20)
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


async def test_line_editing_thinking_quiet_logs_and_two_step_ctrl_c(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    import signal

    fake_llm.reply = "edited fine"
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), MESHSAGE_LLM_BASE_URL=fake_llm.base_url,
               TIKTOKEN_CACHE_DIR="")  # fmt: skip
    err_path = tmp_path / "stderr.txt"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "chat"],
            stdin=slave, stdout=slave, stderr=err, env=env, close_fds=True,
        )  # fmt: skip
    os.close(slave)
    try:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _read_until, master, b"you> ")
        os.write(master, b"helo\x1b[Dl\n")  # type "helo", Left arrow, insert "l"
        out = await loop.run_in_executor(None, _read_until, master, b"you> ")
        assert b"meshsage> edited fine" in out
        asked = fake_llm.chat_requests()[-1]["messages"][-1]["content"]
        assert "hello" in asked and "[D" not in asked and "\x1b" not in asked
        history = tmp_path / "s" / "console_history"
        assert "hello" in history.read_text()
        assert oct(history.stat().st_mode & 0o777) == oct(0o600)
        # A slow model: "thinking..." shows; Ctrl-C stops the answer and the prompt comes
        # back (tests/test_first_hour_console.py types it); a second one, at the prompt, quits.
        fake_llm.script = [("sleep", 60)]
        os.write(master, b"a slow question\n")
        out = await loop.run_in_executor(None, _read_until, master, b"thinking")
        for _ in range(2000):
            if fake_llm.in_flight:
                break
            await asyncio.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out = await loop.run_in_executor(None, _read_until, master, b"you> ")
        assert STOPPED.encode() in out
        assert proc.poll() is None  # the chat goes on
        proc.send_signal(signal.SIGINT)
        code = await loop.run_in_executor(None, proc.wait, 30)
        assert code == 0
        errors = err_path.read_bytes()
        assert b" INFO " not in errors  # a terminal chat is quiet by default
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


async def test_incognito_lines_never_reach_the_history_file(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """Typed while incognito: not in the line-editing history file, during the run or after
    exit (docs/memory.md: nothing said in incognito reaches a later prompt, log or file)."""
    fake_llm.reply = "fine"
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), MESHSAGE_LLM_BASE_URL=fake_llm.base_url,
               TIKTOKEN_CACHE_DIR="")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "chat"],
        stdin=slave, stdout=slave, stderr=subprocess.DEVNULL, env=env, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    history = tmp_path / "s" / "console_history"
    try:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _read_until, master, b"you> ")
        for line in (b"before it", b"!incognito", b"my pin is 9931", b"!incognito off",
                     b"after it"):  # fmt: skip
            os.write(master, line + b"\n")
            await loop.run_in_executor(None, _read_until, master, b"you> ")
            if line == b"my pin is 9931":
                assert "9931" not in history.read_text()
        os.write(master, b"\x04")
        assert await loop.run_in_executor(None, proc.wait, 20) == 0
        kept = history.read_text()
        assert "before it" in kept and "after it" in kept
        assert "9931" not in kept and "!incognito" not in kept
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
