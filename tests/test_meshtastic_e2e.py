"""`meshsage run` with only a `meshtastic:` section: the real CLI in a subprocess, the default
interface factory (unmodified TCPInterface) against the fake radio, the fake LLM over HTTP."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_radio import ALICE, FakeTcpRadio
from tests.test_cli import _env, _remembers


async def _wait_for_texts(radio: FakeTcpRadio, n: int, proc: asyncio.subprocess.Process) -> None:
    for _ in range(600):  # a hang guard (30 s), not a timing assertion
        if len(radio.shown) >= n:
            return
        if proc.returncode is not None:
            break
        await asyncio.sleep(0.05)
    raise AssertionError(f"no answer on the radio (texts: {radio.texts()})")


async def _run_once(config: Path, env: dict[str, str], radio: FakeTcpRadio, text: str) -> str:
    # Counted as the person sees them (``shown``): an answer whose ACK the stopped run never
    # saw is written again at the next start with its packet id, and the radio drops it.
    before = len(radio.shown)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", "--config", str(config),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        for _ in range(600):  # until the bot's node is connected
            if radio.conn is not None and any(m.HasField("want_config_id") for _, m in radio.log):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        radio.inject_text(text, frm=ALICE)
        await _wait_for_texts(radio, before + 1, proc)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "stopped cleanly" in err.decode()
    assert text not in err.decode()  # no message text in the INFO log
    assert len(radio.shown) == before + 1  # one answer, no "thinking..." or notices
    packet = radio.shown[-1][1]
    assert (packet.to, packet.want_ack) == (ALICE, True)
    return bytes(packet.decoded.payload).decode("utf-8")


async def test_run_answers_a_dm_and_remembers_after_restart(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply_fn = _remembers
    radio = FakeTcpRadio()
    config = tmp_path / "meshsage.yaml"
    config.write_text(f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}}}\n")
    env = _env(tmp_path, fake_llm)
    try:
        assert await _run_once(config, env, radio, "my dog is called Rex") == "Nice!"
        answer = await _run_once(config, env, radio, "what is my dog called?")
        assert answer == "Your dog is Rex."
    finally:
        radio.stop()
    assert all(len(p.decoded.payload) <= 200 for _, p in radio.sent_texts())
    request = fake_llm.chat_requests()[-1]
    assert "LoRa" in request["messages"][0]["content"]  # the mesh style hint reached the model


async def test_run_logs_a_model_that_is_not_pulled_at_start(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """`meshsage run` probes the LLM at start: one log line naming the fix, with no message
    sent; and what the server holds is logged (a server that reports nothing: said so)."""
    radio = FakeTcpRadio()
    config = tmp_path / "meshsage.yaml"
    config.write_text(f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio.port}}}\n")
    env = _env(tmp_path, fake_llm) | {"MESHSAGE_LLM_MODEL": "llama3.2:3b"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", "--config", str(config),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        for _ in range(600):  # until the bot's node is connected (a hang guard)
            if radio.conn is not None and any(m.HasField("want_config_id") for _, m in radio.log):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, raw = await asyncio.wait_for(proc.communicate(), 30)
        radio.stop()
    err = raw.decode()
    probe = [line for line in err.splitlines() if "has no model" in line]
    assert len(probe) == 1 and "WARNING" in probe[0], err[-2000:]
    assert "ollama pull llama3.2:3b" in probe[0] and "(it has: fake)" in probe[0]
    assert "LLM server limits: the server reports no context size" in err
