"""Interactive console on a real pseudo-terminal: prompt, answer, Ctrl-D quits."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

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
