"""A newcomer's first hour (issue 38): the LLM notice says where the bot looked and the fix in
one packet; ``!more`` goes on after an answer cut at max_tokens; the command texts are true
(history, link, export, plurals, sessions); a chat config can be checked from a script; the
operator finds the web view. Real parts: the app, SQLite files, the openai client over HTTP to
the fake LLM server, the CLI in a subprocess without a terminal."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bot.answering import unavailable_notice
from bot.commands import GO_ON
from bot.llm.port import TRUNCATED_MARK
from bot.ops.status import Status, render
from bot.text import MESH_COMMAND_BYTES, counted
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM

ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path: Path, fake_llm: FakeLLM) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), MESHSAGE_LLM_BASE_URL=fake_llm.base_url,
               MESHSAGE_LLM_MODEL="fake", TIKTOKEN_CACHE_DIR="")  # fmt: skip
    return env


def _cli(
    *args: str, env: dict[str, str], text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a script or CI job runs it: no terminal on stdin."""
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args], input=text,
        stdin=None if text is not None else subprocess.DEVNULL,
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip


async def _run(
    *args: str, env: dict[str, str], text: str | None = None
) -> subprocess.CompletedProcess[str]:
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: _cli(*args, env=env, text=text)
    )


# --- 3. the first chat works or says what to start ------------------------------------------
async def test_the_unreachable_llm_notice_names_the_url_and_the_fix(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    url = fake_llm.base_url
    await fake_llm.stop()  # nothing listens there any more
    h = await start_harness(tmp_path, fake_llm, read_timeout=2)
    try:
        await h.say("hello?")
        [notice] = h.transport.texts()
        assert url in notice and "Operator: start the LLM server there" in notice
        assert "llm.base_url" in notice
        assert len(notice.encode("utf-8")) <= MESH_COMMAND_BYTES  # one mesh packet
        await asyncio.sleep(0)
        await h.say("still there?")  # 30 minutes later: the same words, not a bare apology
        assert h.transport.texts()[-1] == notice
    finally:
        await h.app.close()


def test_the_notice_fits_one_packet_whatever_the_url() -> None:
    long = "https://user:hunter2@" + "very-long-host-name." * 8 + "example.com:8443/api/v1"
    notice = unavailable_notice(long, fallbacks=2)
    assert len(notice.encode("utf-8")) <= MESH_COMMAND_BYTES
    assert "hunter2" not in notice  # never a password
    assert notice.endswith("Try again later.")  # the fix is never the part cut
    assert "https://very-long-host-name." in notice  # still says where, as far as it fits
    short = unavailable_notice("http://pi.local:11434/v1", fallbacks=1)
    assert "http://pi.local:11434/v1 (and 1 fallback)" in short


async def test_the_chat_says_where_it_looked_without_an_llm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHSAGE_")}
    env.update(MESHSAGE_STATE_DIR=str(tmp_path / "s"), TIKTOKEN_CACHE_DIR="",
               MESHSAGE_LLM_BASE_URL="http://127.0.0.1:9/v1")  # fmt: skip
    done = await _run("chat", env=env, text="hello\n")
    assert done.returncode == 0, done.stderr
    assert "no answer from http://127.0.0.1:9/v1" in done.stdout
    assert "nothing answers at http://127.0.0.1:9/v1" in done.stderr  # the start line too


# --- 5. !more goes on after a max_tokens cut, on every transport --------------------------------
async def test_more_goes_on_after_an_answer_cut_at_max_tokens(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    try:
        fake_llm.script = [("length", "Antennas come in three kinds: the dipole, the")]
        await h.say("tell me about antennas")
        assert h.transport.texts()[-1].endswith(TRUNCATED_MARK)
        fake_llm.script = [("reply", "yagi and the ground plane.")]
        await h.say("!more")
        assert h.transport.texts()[-1] == "yagi and the ground plane."
        asked = fake_llm.chat_requests()[-1]["messages"]
        assert asked[-1]["content"].endswith(GO_ON)
        assert any("the dipole, the" in m["content"] for m in asked[:-1])  # it sees the cut
        await h.say("!more")  # the continuation was complete
        assert h.transport.texts()[-1] == "Nothing more: my last answer was complete."
    finally:
        await h.app.close()


async def test_more_on_the_console_continues_a_cut_answer(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.script = [("length", "The first half of it"), ("reply", "and the second half.")]
    done = await _run("chat", env=_env(tmp_path, fake_llm), text="tell me\n!more\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"The first half of it{TRUNCATED_MARK}",
                                        "and the second half."]  # fmt: skip


# --- 5. the command texts are true -------------------------------------------------------------
def test_counted_says_one_thing_and_many_things() -> None:
    assert [counted(1, "message"), counted(2, "message"), counted(0, "message")] == [
        "1 message", "2 messages", "0 messages"]  # fmt: skip
    assert [counted(1, "summary"), counted(3, "summary"), counted(1, "fact")] == [
        "1 summary", "3 summaries", "1 fact"]  # fmt: skip


async def test_the_console_commands_say_what_is_true(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "Hello!"
    env = _env(tmp_path, fake_llm)
    done = await _run("chat", env=env, text="hi\n!status\n!link\n")
    said = done.stdout.splitlines()
    assert said[1].endswith("you sent 1 message.")  # not "1 messages"
    code = said[2].split("code is ")[1].split(".")[0]
    done = await _run("chat", env=env, text=f"!link {code}\n!export\n!history\n")
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    # One's own code on the same account: nothing linked, and the reply says why.
    assert said[0].startswith("No link made.") and "other account" in said[0]
    # !export on the console: both files saved, and both paths shown.
    assert said[1].startswith("Your export, saved as Markdown and as JSON")
    assert said[2].startswith("[saved ") and said[2].endswith(".md]")
    json_path = Path(said[3].removeprefix("[saved ").removesuffix("]"))
    assert json_path.suffix == ".json" and json_path.is_file()
    assert said[4:6] == ["you: hi", "me: Hello!"]  # both sides, as README says
    done = await _run("chat", env=env, text="!forget\n!forget yes\n!history\n")
    said = done.stdout.splitlines()
    assert said[1].startswith("Deleted everything I kept about you: 2 messages, 0 summaries")
    assert said[2] == "I keep no messages of ours here."  # no reset happened: none is claimed
    assert not json_path.exists()  # !forget took the export files too


async def test_history_after_a_reset_says_so(tmp_path: Path, fake_llm: FakeLLM) -> None:
    h = await start_harness(tmp_path, fake_llm)
    try:
        await h.say("hello")
        await h.say("!reset")
        await h.say("!history")
        assert h.transport.texts()[-1] == "No messages since your last !reset."
    finally:
        await h.app.close()


# --- 4. judging a config from a script -------------------------------------------------------
async def test_check_config_and_doctor_judge_the_example_for_the_chat_from_a_script(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    env = _env(tmp_path, fake_llm)
    example = str(ROOT / "config.example.yaml")
    service = await _run("check-config", example, env=env)
    assert service.returncode == 2  # the default stays the service's rule: no terminal, refused
    assert "--for chat" in service.stderr  # ... and it names the way to check a chat config
    chat = await _run("check-config", "--for", "chat", example, env=env)
    assert chat.returncode == 0, chat.stderr
    assert "OK (for `meshsage chat`: the console;" in chat.stdout
    assert (await _run("check-config", "--for", "service", example, env=env)).returncode == 2
    doctor = await _run("doctor", "--for", "chat", "--config", example, env=env)
    assert doctor.stdout.splitlines()[0].startswith("ok   config: "), doctor.stdout
    assert doctor.returncode == 0, doctor.stdout
    plain = await _run("doctor", "--config", example, env=env)
    assert plain.stdout.startswith("FAIL config:") and plain.returncode == 2


# --- 7. the operator finds the web view ------------------------------------------------------
async def test_run_logs_and_status_shows_the_web_view(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bot")
    h = await start_harness(tmp_path, fake_llm, extra="web:\n  enabled: true\n  port: 0\n")
    try:
        assert h.app.web is not None and h.app.web.port
        where = f"http://127.0.0.1:{h.app.web.port}/ (loopback only)"
        assert f"web view on {where}" in caplog.text
        lines, _ok = render(await h.app.status_now())
        assert f"  web view:   {where}" in lines
    finally:
        await h.app.close()


async def test_without_the_web_view_run_and_status_say_how_to_get_one(
    tmp_path: Path, fake_llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bot")
    h = await start_harness(tmp_path, fake_llm)
    try:
        off = "off (web: enabled: true serves it at http://127.0.0.1:8470/)"
        assert f"web view {off}" in caplog.text
        lines, _ok = render(await h.app.status_now())
        assert f"  web view:   {off}" in lines
    finally:
        await h.app.close()


def test_a_report_written_a_moment_ahead_is_never_minus_zero_seconds_old() -> None:
    status = Status(written_at=100.3, started_at=50.0, pid=1, version="x", healthy=True)
    lines, _ok = render(status, now=100.0)
    assert "-0 s" not in lines[1] and "written 0 s ago" in lines[1]


async def test_the_airtime_page_without_a_radio_is_one_sentence(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    from tests.web_harness import client, web_app

    async with (
        web_app(tmp_path, fake_llm, None) as app,
        client(app) as http,
        http.get("/airtime") as r,
    ):
        page = await r.text()
    main = page[page.index("<section") : page.rindex("</section>")]
    assert main.count("<section") == 1, main  # no empty "Last hour"/"Last day" cards
    assert "No radio is configured" in main
    assert not re.search(r'id="[^"]+"></div>', page)  # no card without content


def test_install_help_names_the_dry_run() -> None:
    done = subprocess.run(["bash", str(ROOT / "systemd" / "install.sh"), "--help"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0
    assert "MESHSAGE_ROOT=DIR" in done.stdout and "Dry run" in done.stdout
