"""The real CLI in a subprocess: scripted chat, restart memory, signals, exit codes, privacy."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from tests.fakes.fake_llm import FakeLLM

SECRET = "zanzibar-omelette"


def _env(tmp_path: Path, llm: FakeLLM) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(
        MESHSAGE_STATE_DIR=str(tmp_path / "state"),
        MESHSAGE_LLM_BASE_URL=llm.base_url,
        MESHSAGE_LLM_MODEL="fake",
        TIKTOKEN_CACHE_DIR="",
    )
    return env


async def _meshsage(
    *args: str, env: dict[str, str], stdin: bytes = b"", timeout: float = 90
) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:  # kill it and reap it: its pipes must not outlive the test
        proc.kill()
        await proc.communicate()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _remembers(body: dict[str, Any]) -> str:
    earlier = " ".join(m["content"] for m in body["messages"][:-1])
    if "what is my dog" in body["messages"][-1]["content"]:
        return "Your dog is Rex." if "my dog is called Rex" in earlier else "I don't know."
    return "Nice!"


async def test_scripted_chat_remembers_across_restarts(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply_fn = _remembers
    env = _env(tmp_path, fake_llm)
    rc, out, _ = await _meshsage("chat", env=env, stdin=b"my dog is called Rex\n!status\n")
    assert rc == 0
    assert out.splitlines()[0] == "Nice!"
    assert out.splitlines()[1].startswith("Model fake, up ")
    rc, out, _ = await _meshsage("chat", env=env, stdin=b"what is my dog called?\n")
    assert rc == 0 and out.strip() == "Your dog is Rex."


async def test_message_text_never_logged_at_info(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = f"the answer mentions {SECRET} too"
    rc, out, err = await _meshsage(  # -v: a chat logs below WARNING only when asked
        "chat", "-v", env=_env(tmp_path, fake_llm), stdin=f"my secret is {SECRET}\n".encode()
    )
    assert rc == 0 and SECRET in out
    assert "answered console:" in err  # INFO (and DEBUG) logging is on ...
    assert SECRET not in err  # ... and carries no message text


async def _stored(tmp_path: Path) -> list[tuple[str, str, str]]:
    """(role, text, status) of every stored message, read from the database file."""
    with sqlite3.connect(tmp_path / "state" / "meshsage.db") as db:
        rows = db.execute("SELECT role, text, status FROM messages ORDER BY id").fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


async def test_invalid_utf8_and_nul_input(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "got it"
    rc, out, _ = await _meshsage(
        "chat", env=_env(tmp_path, fake_llm), stdin=b"caf\xe9 \xff\xfe bytes\x00\n\n"
    )
    assert rc == 0 and out.strip() == "got it"
    # Bad bytes become U+FFFD, the NUL goes, every readable character is kept.
    assert await _stored(tmp_path) == [
        ("user", "caf\ufffd \ufffd\ufffd bytes", "answered"),
        ("assistant", "got it", "delivered"),
    ]


async def _run_with_input(line: bytes, *, env: dict[str, str]) -> asyncio.subprocess.Process:
    """``meshsage chat`` in a subprocess, with ``line`` written to its stdin (left open).
    (``run`` refuses a console-only config without a terminal: see test_preflight.py.)"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "chat", "-v",  # -v: "stopped cleanly" is logged at INFO
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(line)
    await proc.stdin.drain()
    return proc


async def test_run_stops_cleanly_on_sigterm(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "pong"
    proc = await _run_with_input(b"ping\n", env=_env(tmp_path, fake_llm))
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)  # start-up on a loaded machine
    assert line.decode().strip() == "pong"
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0
    assert "stopped cleanly" in err.decode()


async def test_sigterm_finishes_the_turn_in_flight(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script = [("sleep", 1.0)]  # the answer is still being generated at SIGTERM
    fake_llm.reply = "late but complete"
    proc = await _run_with_input(b"a slow question\n", env=_env(tmp_path, fake_llm))
    for _ in range(6000):  # up to 60 s for the process to start and ask the LLM (loaded CI)
        if fake_llm.in_flight or proc.returncode is not None:
            break
        await asyncio.sleep(0.01)
    assert fake_llm.in_flight == 1 and proc.returncode is None
    proc.send_signal(signal.SIGTERM)
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "late but complete"
    assert "stopped cleanly" in err.decode()
    assert await _stored(tmp_path) == [
        ("user", "a slow question", "answered"),
        ("assistant", "late but complete", "delivered"),
    ]


async def test_unwritable_state_dir_exit_code(tmp_path: Path, fake_llm: FakeLLM) -> None:
    env = _env(tmp_path, fake_llm)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env["MESHSAGE_STATE_DIR"] = str(blocker / "state")
    rc, _, err = await _meshsage("chat", env=env)
    assert rc == 2  # refused by the preflight, before anything is opened
    assert "cannot create the state directory" in err and "MESHSAGE_STATE_DIR" in err
    assert "Traceback" not in err


async def test_bad_config_exit_code(tmp_path: Path, fake_llm: FakeLLM) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("llm:\n  retries: -3\n")
    rc, _, err = await _meshsage("run", "--config", str(cfg), env=_env(tmp_path, fake_llm))
    assert rc == 2 and "llm.retries" in err and "Traceback" not in err


async def test_memory_show_prints_blocks(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "Noted."
    env = _env(tmp_path, fake_llm)
    user = "tester"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"console:\n  user: {user}\n  context_tokens: 300\n")
    script = b"I planted tomatoes in April\n" + b"".join(
        f"unrelated chat number {i}\n".encode() for i in range(25)
    )
    rc, _, _ = await _meshsage("chat", "--config", str(cfg), env=env, stdin=script)
    assert rc == 0
    rc, out, _ = await _meshsage(
        "memory", "show", user, "--message", "when did I plant tomatoes?",
        "--config", str(cfg), env=env,
    )  # fmt: skip
    assert rc == 0
    assert "## retrieved (" in out and "I planted tomatoes in April" in out
    assert "## window (" in out
    why = out.split("## why these older turns were retrieved\n", 1)[1].split("\n\n")[0]
    assert f"({user}): ranked #1, score " in why  # the planted turn is the best match


async def test_memory_show_prints_exactly_what_a_turn_sends(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Noted."
    env = _env(tmp_path, fake_llm)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("console:\n  user: tester\n")
    rc, _, _ = await _meshsage("chat", "--config", str(cfg), env=env,
                               stdin=b"my kayak is red\nit has two seats\n")  # fmt: skip
    assert rc == 0
    rc, out, _ = await _meshsage(
        "memory", "show", "tester", "--message", "what colour is it?", "--config", str(cfg),
        env=env,
    )  # fmt: skip
    assert rc == 0
    shown = out.split("messages sent to", 1)[1].split("\n## ")[1:]
    rc, _, _ = await _meshsage("chat", "--config", str(cfg), env=env,
                               stdin=b"what colour is it?\n")  # fmt: skip
    sent = fake_llm.chat_requests()[-1]["messages"]
    assert [s.split("\n", 1)[0] for s in shown] == [m["role"] for m in sent]
    assert [s.split("\n", 1)[1].rstrip("\n") for s in shown] == [m["content"] for m in sent]
    assert "few short paragraphs" in sent[0]["content"]  # the console's style hint is in both
