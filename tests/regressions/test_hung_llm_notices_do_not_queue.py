"""Regression: with the LLM hung, each waiting person's "unavailable" notice waited for the
previous person's call to time out, then for their own (issue 10, point 9). Now the replies
waiting behind a failed call fail with it, and while the server is known to be down only one
probe request runs at a time."""

from __future__ import annotations

from pathlib import Path

from bot.answering import unavailable_notice
from bot.domain import ReplyKind
from tests.conftest import start_harness
from tests.fakes.fake_llm import FakeLLM

HUNG = ("sleep", 60)  # far beyond the read timeout: the server accepted and never answers
# Their own read timeouts (the suite's default is 30 s), each test waits one out: short to keep
# them quick; where healthy answers follow, long enough for them on a loaded machine (the fake
# answers in milliseconds).
READ_TIMEOUT = 4
HUNG_ONLY_TIMEOUT = 2  # no call is answered: nothing to wait for but the timeout


async def test_people_waiting_behind_a_hung_call_get_their_notice_with_it(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, read_timeout=HUNG_ONLY_TIMEOUT)
    try:
        fake_llm.script = [HUNG, HUNG, HUNG]
        for person in ("ann", "bob", "cat"):
            await h.transport.say("are you there?", sender=person)
        await h.app.responder.wait_idle()
        notices = [(r.inbound.sender, r.kind, r.text) for r in h.transport.sent]
        assert sorted(notices) == [
            (p, ReplyKind.NOTICE, unavailable_notice(fake_llm.base_url))
            for p in ("ann", "bob", "cat")
        ]
        # One request reached the hung server; bob and cat did not each wait out a timeout.
        assert len(fake_llm.chat_requests()) == 1
    finally:
        await h.app.close()


async def test_after_an_outage_one_probe_runs_and_success_ends_it(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm, read_timeout=READ_TIMEOUT)
    try:
        fake_llm.script = [HUNG]
        await h.say("first", sender="ann")
        assert h.transport.texts() == [unavailable_notice(fake_llm.base_url)]
        fake_llm.reply = "back again"  # the server recovers: the next reply is the probe
        await h.say("second", sender="bob")
        await h.say("third", sender="cat")
        assert h.transport.texts()[1:] == ["back again", "back again"]
        assert len(fake_llm.chat_requests()) == 3
    finally:
        await h.app.close()
