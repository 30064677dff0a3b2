"""Linked identities and incognito: !link codes (single use, 10 minutes, rate-limited, wrong
codes reveal nothing), one DM memory across two transports, !unlink giving each side its own
messages back (also mid-turn), channels never merged; !incognito stores nothing new."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import App, build
from bot.domain import DM_SPACE, ConversationKey
from bot.memory.core.identity import LinkError
from bot.memory.links import CODE_TTL, LONG_DIGITS, MAX_ATTEMPTS, MAX_FAILURES, LinkCodes
from bot.memory.store import SqliteStore
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

MESH = ConversationKey("mesh", "!1234abcd")
DISCORD = ConversationKey("discord", "1001")


class Rig:
    def __init__(self, app: App, mesh: FakeTransport, discord: FakeTransport) -> None:
        self.app, self.mesh, self.discord = app, mesh, discord

    async def say(self, transport: FakeTransport, text: str, **kw: Any) -> str:
        await transport.say(text, **kw)
        await self.app.responder.wait_idle()
        return transport.texts()[-1]


@pytest.fixture
async def rig(tmp_path: Path, fake_llm: FakeLLM) -> AsyncIterator[Rig]:
    mesh, discord = FakeTransport(name="mesh"), FakeTransport(name="discord")
    config = make_config(  # commands count against the rate limit: these tests send many
        tmp_path, fake_llm.base_url, "bot:\n  rate_limit:\n    messages: 1000\n    per_seconds: 1\n"
    )
    app = await build(config, env={}, transports=[mesh, discord])
    await app.start()
    yield Rig(app, mesh, discord)
    await app.close()


def _code(reply: str) -> str:
    return reply.split("code is ")[1][:6]


async def test_link_then_unlink_round_trip(rig: Rig, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "ok"
    await rig.say(rig.mesh, "my boat is called Selkie", sender=MESH.person)
    await rig.say(rig.mesh, "!remember I sail on weekends", sender=MESH.person)
    await rig.say(rig.discord, "my bike is a Brompton", sender=DISCORD.person)
    await rig.say(rig.discord, "@bot public hello", sender=DISCORD.person, space="chan")
    store = rig.app.store
    mesh_own = {m.text for m in await store.all_messages((await store.conversation(MESH)).id)}

    code = _code(await rig.say(rig.mesh, "!link", sender=MESH.person))
    reply = await rig.say(rig.discord, f"!link {code}", sender=DISCORD.person)
    assert reply.startswith("Linked with your mesh account") and "2 messages joined" in reply

    # One DM memory: the Discord DM sees the mesh history and facts, and vice versa.
    await rig.say(rig.discord, "what is my boat called?", sender=DISCORD.person)
    prompt = json.dumps(fake_llm.chat_requests()[-1]["messages"])
    assert "Selkie" in prompt and "I sail on weekends" in prompt and "Brompton" in prompt
    await rig.say(rig.mesh, "and my bike?", sender=MESH.person)
    prompt = json.dumps(fake_llm.chat_requests()[-1]["messages"])
    assert "Brompton" in prompt
    # The channel space is never merged.
    await rig.say(rig.discord, "@bot boat?", sender=DISCORD.person, space="chan")
    prompt = json.dumps(fake_llm.chat_requests()[-1]["messages"])
    assert "Selkie" not in prompt and "I sail on weekends" not in prompt

    assert (await rig.say(rig.discord, "!unlink", sender=DISCORD.person)).startswith("Unlinked")
    mesh_conv = await store.conversation(MESH)
    discord_conv = await store.conversation(DISCORD)
    assert mesh_conv.origin_id is None and discord_conv.origin_id is None
    mesh_texts = {m.text for m in await store.all_messages(mesh_conv.id)}
    discord_texts = {m.text for m in await store.all_messages(discord_conv.id)}
    assert mesh_own <= mesh_texts and "and my bike?" in mesh_texts
    assert {"my bike is a Brompton", "what is my boat called?"} <= discord_texts
    assert not mesh_texts & {"my bike is a Brompton", "what is my boat called?"}
    assert "Selkie" not in " ".join(discord_texts)
    assert [f.text for f in await store.facts(mesh_conv.id)] == ["I sail on weekends"]
    assert await store.facts(discord_conv.id) == []
    # Search rows followed the messages (FTS is keyed by conversation).
    hits = await store.search_terms(discord_conv.id, ["selkie"], after_id=0, before_id=1 << 40)
    assert hits == [[]]
    assert (await rig.say(rig.mesh, "!unlink", sender=MESH.person)) == "This account is not linked."


async def test_codes_are_single_use_and_wrong_codes_reveal_nothing(rig: Rig) -> None:
    code = _code(await rig.say(rig.mesh, "!link", sender=MESH.person))
    same = await rig.say(rig.mesh, f"!link {code}", sender=MESH.person)  # same transport
    wrong = "000000" if code != "000000" else "111111"
    guessed = await rig.say(rig.discord, f"!link {wrong}", sender="666")
    assert same == guessed and guessed.startswith("No link made")
    assert (await rig.say(rig.discord, f"!link {code}", sender=DISCORD.person)).startswith("Linked")
    reused = await rig.say(rig.discord, f"!link {code}", sender="777")
    assert reused == guessed  # a spent code looks exactly like a wrong one
    channel = await rig.say(rig.discord, "!link", sender=DISCORD.person, space="chan")
    assert "direct message" in channel


async def test_codes_expire_and_attempts_are_rate_limited(store: SqliteStore) -> None:
    now = [time.time()]
    codes = LinkCodes(store, clock=lambda: now[0])
    code = await codes.issue("mesh", "!a")
    assert len(code) == 6 and code.isdigit()
    rows = await store._all("SELECT code_hash FROM link_codes")
    assert [r[0] for r in rows] != [code] and len(rows[0][0]) == 64  # stored hashed
    now[0] += CODE_TTL + 1
    assert await codes.redeem(code, "discord", "x") is None  # expired
    code = await codes.issue("mesh", "!a")
    assert await codes.redeem(code, "discord", "y") == ConversationKey("mesh", "!a", DM_SPACE)
    for _ in range(MAX_ATTEMPTS):
        assert await codes.allowed("discord", "g")
        assert await codes.redeem("000000", "discord", "g") is None
    assert not await codes.allowed("discord", "g")  # guessing stops here for 10 minutes
    assert await codes.allowed("discord", "h")  # another account still may
    now[0] += CODE_TTL + 1
    assert await codes.allowed("discord", "g")
    first = await codes.issue("mesh", "!b")
    second = await codes.issue("mesh", "!b")  # a new code replaces the old one
    assert await codes.redeem(first, "discord", "z") is None or first == second


async def test_other_accounts_guesses_never_refuse_a_right_code(store: SqliteStore) -> None:
    """Six accounts x 5 wrong tries used to exhaust a global cap and refuse every honest link,
    the right code included. Now each guessing account stops at MAX_ATTEMPTS, the right code
    still works, and codes issued during the storm are LONG_DIGITS long."""
    now = [time.time()]
    codes = LinkCodes(store, clock=lambda: now[0])
    honest = await codes.issue("mesh", "!a")
    tried = 0
    for account in range(20):
        for _ in range(MAX_ATTEMPTS + 1):
            if not await codes.allowed("discord", f"fresh{account}"):
                break
            await codes.redeem(f"{tried:06d}" if f"{tried:06d}" != honest else "x",
                               "discord", f"fresh{account}")  # fmt: skip
            tried += 1
    assert tried == 20 * MAX_ATTEMPTS > MAX_FAILURES  # each account stopped at its own cap
    assert await codes.allowed("discord", "the-person")
    assert await codes.redeem(honest, "discord", "the-person") == ConversationKey(
        "mesh", "!a", DM_SPACE
    )
    storm = await codes.issue("mesh", "!b")
    assert len(storm) == LONG_DIGITS and storm.isdigit()
    assert await codes.redeem(storm, "discord", "the-person") == ConversationKey(
        "mesh", "!b", DM_SPACE
    )
    now[0] += CODE_TTL + 1
    assert len(await codes.issue("mesh", "!c")) == 6  # the storm is over


async def test_a_code_survives_a_restart(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    code = await LinkCodes(store).issue("mesh", "!a")
    await store.close()
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        assert await LinkCodes(store).redeem(code, "discord", "1") == ConversationKey(
            "mesh", "!a", DM_SPACE
        )
    finally:
        await store.close()


async def test_channels_never_link(store: SqliteStore) -> None:
    with pytest.raises(LinkError, match="channel"):
        await store.link_dm(MESH, ConversationKey("discord", "1001", "chan"))
    with pytest.raises(LinkError, match="other transport"):
        await store.link_dm(MESH, ConversationKey("mesh", "!other"))


async def test_unlink_while_a_turn_is_in_flight(store: SqliteStore) -> None:
    home = await store.conversation(MESH)
    await store.add_message(home.id, role="user", author="a", text="mesh one", tokens=1,
                            status="answered")  # fmt: skip
    await store.link_dm(MESH, DISCORD)
    during = await store.conversation(DISCORD)  # the turn resolved the linked memory
    assert (during.id, during.origin_id) == (home.id, during.origin_id)
    assert during.origin_id is not None
    q = await store.add_message(during.id, role="user", author="d", text="discord question",
                                tokens=1, status="pending", origin_id=during.origin_id)  # fmt: skip
    assert await store.unlink_dm(DISCORD) == 1  # lands while the answer is being generated
    a = await store.add_message(during.id, role="assistant", author="bot", text="the answer",
                                tokens=1, status="sending", answers=q,
                                origin_id=during.origin_id)  # fmt: skip
    own = await store.conversation(DISCORD)
    assert [m.id for m in await store.all_messages(own.id)] == [q, a]  # both stayed together
    assert [m.text for m in await store.all_messages(home.id)] == ["mesh one"]


async def test_forget_on_one_side_keeps_the_other_sides_messages(store: SqliteStore) -> None:
    home = await store.conversation(MESH)
    await store.add_message(home.id, role="user", author="a", text="mesh keeps", tokens=1,
                            status="answered")  # fmt: skip
    other = await store.conversation(DISCORD)
    await store.add_message(other.id, role="user", author="d", text="discord goes", tokens=1,
                            status="answered")  # fmt: skip
    await store.link_dm(MESH, DISCORD)
    report = await store.forget_person("discord", DISCORD.person)
    assert report.messages == 1
    texts = [m.text for m in await store.all_messages((await store.conversation(MESH)).id)]
    assert texts == ["mesh keeps"]


async def test_incognito_stores_nothing_new_and_still_answers(rig: Rig, fake_llm: FakeLLM) -> None:
    fake_llm.reply = "ok"
    await rig.say(rig.mesh, "stored before", sender=MESH.person)
    assert "Incognito on" in await rig.say(rig.mesh, "!incognito", sender=MESH.person)
    assert "Incognito is ON" in await rig.say(rig.mesh, "!status", sender=MESH.person)
    await rig.say(rig.mesh, "my secret plan is BLUEBIRD", sender=MESH.person)
    await rig.say(rig.mesh, "what was my plan?", sender=MESH.person)
    prompt = json.dumps(fake_llm.chat_requests()[-1]["messages"])
    assert "BLUEBIRD" in prompt and "stored before" in prompt  # held in memory, and the log
    assert isinstance(rig.app.store, SqliteStore)  # the rig runs on the default store
    db = sqlite3.connect(rig.app.store.path)
    stored = [r[0] for r in db.execute("SELECT text FROM messages")]
    db.close()
    assert not any("BLUEBIRD" in t or "plan?" in t for t in stored)
    assert "Incognito off" in await rig.say(rig.mesh, "!incognito off", sender=MESH.person)
    await rig.say(rig.mesh, "back on the record", sender=MESH.person)
    prompt = json.dumps(fake_llm.chat_requests()[-1]["messages"])
    assert "BLUEBIRD" not in prompt  # the incognito turns are gone with incognito
    assert "Incognito" not in await rig.say(rig.mesh, "!status", sender=MESH.person)


async def test_an_answer_stored_after_unlink_goes_to_its_own_side(store: SqliteStore) -> None:
    from bot.memory.records import OutboxEntry, StoredAnswer

    await store.conversation(MESH)
    await store.link_dm(MESH, DISCORD)
    during = await store.conversation(DISCORD)
    q = await store.add_message(during.id, role="user", author="d", text="asked via discord",
                                tokens=1, status="pending", origin_id=during.origin_id)  # fmt: skip
    await store.unlink_dm(MESH)  # from the other side, while the answer is being generated
    await store.queue_delivery(
        OutboxEntry(DISCORD, "answer", "the answer", question_id=q),
        answer=StoredAnswer(during.id, "bot", "the answer", 2, origin_id=during.origin_id),
    )
    own = await store.conversation(DISCORD)
    assert [m.text for m in await store.all_messages(own.id)] == ["asked via discord", "the answer"]
    assert await store.all_messages((await store.conversation(MESH)).id) == []
