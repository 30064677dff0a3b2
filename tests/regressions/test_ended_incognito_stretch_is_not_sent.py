"""An ended incognito stretch stays forgotten: after ``!incognito off`` and a new
``!incognito``, the earlier stretch's text reached the next prompt (issue 17, point 6).
The exact sequence from the issue is piped through the real ``meshsage chat``; the fake LLM's
request log is what is checked."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.fake_llm import FakeLLM
from tests.test_cli import _env, _meshsage

SECRET = "4242"


async def test_new_incognito_stretch_does_not_see_the_ended_one(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.reply = "Noted."
    script = (
        b"hello there\n!incognito\nmy secret is 4242\n!incognito off\n!incognito\nwhat is new\n"
    )
    rc, _, err = await _meshsage("chat", env=_env(tmp_path, fake_llm), stdin=script)
    assert rc == 0, err
    requests = fake_llm.chat_requests()
    contents = [m["content"] for body in requests for m in body["messages"]]
    asked = [body["messages"][-1]["content"] for body in requests]
    assert any("my secret is 4242" in c for c in asked)  # the stretch itself saw it ...
    last = requests[-1]
    assert "what is new" in last["messages"][-1]["content"]
    assert SECRET not in json.dumps(last)  # ... the next stretch does not
    assert "Earlier in this incognito session" not in json.dumps(last)
    assert sum(SECRET in c for c in contents) == 1  # only the turn it was said in
    assert SECRET not in err  # nor any log line
    for path in (tmp_path / "state").rglob("*"):  # nor any file the bot wrote
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


async def test_reset_ends_the_incognito_stretch(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "Noted."
    script = b"!incognito\nmy secret is 4242\n!reset\nwhat did I say\n"
    rc, _, err = await _meshsage("chat", env=_env(tmp_path, fake_llm), stdin=script)
    assert rc == 0, err
    assert SECRET not in json.dumps(fake_llm.chat_requests()[-1])
