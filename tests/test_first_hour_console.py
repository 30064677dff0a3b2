"""A newcomer's first hour in ``meshsage chat`` (issue 38): Ctrl-C on a real terminal stops
the answer and the prompt comes back, a second Ctrl-C quits, the terminal keeps its echo; a
piped chat prints no INFO lines and summarizes the session a ``!reset`` ended before it exits.

Ctrl-C is typed the way a person types it: ``\\x03`` into the pseudo-terminal that is the
chat's controlling terminal, so the line discipline sends SIGINT (no ``send_signal``)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import sqlite3
import subprocess
import sys
import termios
from pathlib import Path

from bot.interrupts import Interrupts
from bot.transports.console import STOPPED
from tests.fakes.fake_llm import FakeLLM
from tests.test_console_tty import _read_until as read_until


def _env(tmp_path: Path, fake_llm: FakeLLM) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), MESHSAGE_LLM_BASE_URL=fake_llm.base_url,
               MESHSAGE_LLM_MODEL="fake", TIKTOKEN_CACHE_DIR="")  # fmt: skip
    return env


def _read_until(fd: int, marker: bytes, timeout: float = 30.0) -> bytes:
    return read_until(fd, marker, timeout)


def _controlling_tty() -> None:
    """In the child, after setsid: the pty on stdin becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _statuses(tmp_path: Path) -> list[tuple[str, str, str]]:
    db = sqlite3.connect(tmp_path / "s" / "meshsage.db")
    try:
        return [tuple(r) for r in db.execute("SELECT role, text, status FROM messages ORDER BY id")]
    finally:
        db.close()


async def _wait_for(check: object, what: str, seconds: float = 30.0) -> None:
    for _ in range(int(seconds * 100)):
        if callable(check) and check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_ctrl_c_stops_the_answer_the_prompt_returns_and_a_second_quits(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    master, slave = pty.openpty()
    err_path = tmp_path / "stderr.txt"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "chat"],
            stdin=slave, stdout=slave, stderr=err, env=_env(tmp_path, fake_llm), close_fds=True,
            start_new_session=True, preexec_fn=_controlling_tty,
        )  # fmt: skip
    try:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _read_until, master, b"you> ")
        fake_llm.script = [("stall", 1)]  # writes a word, then keeps writing nothing
        os.write(master, b"tell me a very long story\n")
        await loop.run_in_executor(None, _read_until, master, b"thinking")
        await _wait_for(lambda: fake_llm.in_flight, "the request to reach the LLM")
        os.write(master, b"\x03")  # Ctrl-C while the answer is being written
        out = await loop.run_in_executor(None, _read_until, master, b"you> ")
        assert STOPPED.encode() in out
        assert proc.poll() is None  # the chat goes on
        await _wait_for(lambda: fake_llm.disconnected, "the LLM request to be closed")
        assert _statuses(tmp_path) == [("user", "tell me a very long story", "failed")]
        # The next question is answered as usual: nothing waits behind the stopped one.
        fake_llm.reply = "a short one"
        os.write(master, b"then a short one\n")
        out = await loop.run_in_executor(None, _read_until, master, b"you> ")
        assert b"meshsage> a short one" in out
        os.write(master, b"\x03")  # Ctrl-C at the prompt: quit
        code = await loop.run_in_executor(None, proc.wait, 30)
        assert code == 0
        attrs = termios.tcgetattr(slave)
        assert attrs[3] & termios.ECHO, "the terminal was left without echo"
        assert attrs[3] & termios.ICANON
        # The stopped question is settled: the next start does not answer it.
        assert _statuses(tmp_path)[0][2] == "failed"
        assert b" INFO " not in err_path.read_bytes()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


class _Responder:
    def __init__(self) -> None:
        self.idle = True
        self.writing = 0  # answers being written that stop_answers can stop
        self.stopped = 0

    def stop_answers(self, transport: str) -> int:
        n, self.writing = self.writing, 0
        self.stopped += n
        return n


class _Console:
    name = "console"

    def __init__(self) -> None:
        self.lines_read = 0
        self.told = 0

    def interrupted(self) -> None:
        self.told += 1


def _keys(
    console: _Console | None,
) -> tuple[Interrupts, _Responder, asyncio.Event, list[str], list[str]]:
    stop = asyncio.Event()
    responder = _Responder()
    hurried: list[str] = []
    said: list[str] = []
    keys = Interrupts(stop=stop, responder=responder, hurry=lambda: hurried.append("now"),
                      say=said.append, console=console, tty=True)  # fmt: skip
    return keys, responder, stop, hurried, said


async def test_ctrl_c_in_a_terminal_chat_stops_each_answer_and_quits_on_the_second() -> None:
    console = _Console()
    keys, responder, stop, hurried, _said = _keys(console)
    console.lines_read, responder.idle, responder.writing = 1, False, 1
    keys()  # an answer is being written: it stops, the chat goes on
    assert (responder.stopped, console.told, stop.is_set()) == (1, 1, False)
    keys()  # again for the same line, the stop still on its way: quit at once
    assert stop.is_set() and hurried == ["now"] and keys.hurried.is_set()

    console = _Console()
    keys, responder, stop, hurried, _said = _keys(console)
    console.lines_read, responder.idle, responder.writing = 1, False, 1
    keys()
    responder.idle = True  # the answer stopped; the prompt is back
    console.lines_read, responder.idle, responder.writing = 2, False, 1
    keys()  # the next line's answer stops too: each line gets its own first Ctrl-C
    assert (responder.stopped, stop.is_set()) == (2, False)
    responder.idle = True
    keys()  # at the prompt: quit cleanly, not in a hurry
    assert stop.is_set() and hurried == []


async def test_ctrl_c_elsewhere_drains_first_then_stops_now() -> None:
    keys, responder, stop, hurried, said = _keys(None)
    responder.idle, responder.writing = False, 1
    keys()
    assert stop.is_set() and hurried == [] and responder.stopped == 0  # never stops an answer
    assert "waiting up to" in said[-1]
    keys()
    assert hurried == ["now"] and "stopping now" in said[-1]
    keys()
    assert hurried == ["now"]  # said and done once


def _chat(tmp_path: Path, fake_llm: FakeLLM, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "chat"],
        input=text, capture_output=True, text=True, env=_env(tmp_path, fake_llm), timeout=120,
    )  # fmt: skip


async def test_a_piped_chat_prints_no_info_lines(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "hello there"
    loop = asyncio.get_running_loop()
    done = await loop.run_in_executor(None, _chat, tmp_path, fake_llm, "hi\n!status\n")
    assert done.returncode == 0, done.stderr
    assert "hello there" in done.stdout
    assert " INFO " not in done.stderr, done.stderr


async def test_a_piped_reset_summarizes_the_session_before_exit(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Rex is a fine name."

    def answer(body: dict[str, object]) -> str:
        system = str(body["messages"][0]["content"])  # type: ignore[index]
        if system.startswith("Summarize this chat session"):
            return "Naming the dog\nThe person named their dog Rex."
        return "Rex is a fine name."

    fake_llm.reply_fn = answer
    loop = asyncio.get_running_loop()
    script = "my dog is called Rex\n!reset\n!sessions\n"
    done = await loop.run_in_executor(None, _chat, tmp_path, fake_llm, script)
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    # Right after the !reset, !sessions says what is true: the session waits for its summary.
    assert said[-1].startswith("The session you ended is being summarized"), said
    assert "summarizing the session that ended before exit" in done.stderr
    db = sqlite3.connect(tmp_path / "s" / "meshsage.db")
    try:
        titles = [r[0] for r in db.execute("SELECT title FROM sessions")]
    finally:
        db.close()
    assert titles == ["Naming the dog"]  # written before exit, not at the next start
    again = await loop.run_in_executor(None, _chat, tmp_path, fake_llm, "!sessions\n")
    assert "Naming the dog" in again.stdout
    assert "summarizing" not in again.stderr  # nothing left over for this start
