"""Commands: answered without the LLM, each reply sized by its transport (one 200-byte packet
on the mesh, one Discord message, the console unlimited)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.domain import ReplyKind
from tests.conftest import Harness, start_harness
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport


def _last(h: Harness) -> str:
    return h.transport.texts()[-1]


# Each command with good, bad and missing arguments; the test fails if a command is missing.
COMMAND_CALLS = [
    "!help", "!status", "!history", "!history 10", "!history 0", "!history x", "!summary",
    "!remember " + "😀🇳🇴 fact " * 35, "!remember", "!remember " + "long " * 100,
    "!facts", "!unremember 9", "!unremember", "!unremember x", "!unremember 1", "!facts",
    "!forget now", "!nosuch", "!HELP", "!reset", "!history 10", "!forget yes", "!forget",
    "!forget yes", "!facts", "!export", "!stats", "!stats please", "!more", "!history ²",
    "!unremember ③", "!history 1000000000000000000000",
    "!sessions", "!pin", "!link", "!link 000000", "!link x", "!unlink", "!incognito",
    "!status", "!incognito maybe", "!incognito off",
    "!persona", "!persona nosuch", "!persona bot " + "長い人格 " * 60, "!persona clear bot",
    "!model", "!model " + "m" * 300, "!model clear bot", "!repin", "!repin x",
    "!repin !0000beef",
]  # fmt: skip


@pytest.mark.parametrize("sender", ["root", "alice"], ids=["operator", "person"])
async def test_every_command_reply_fits_a_mesh_packet_and_skips_the_llm(
    tmp_path: Path, fake_llm: FakeLLM, sender: str
) -> None:
    h = await start_harness(
        tmp_path,
        fake_llm,
        extra='bot:\n  operators: ["meshtastic:root"]\n'
        "  rate_limit: {messages: 100, per_seconds: 60}\n",
        transport=FakeTransport(name="meshtastic"),
    )  # commands count against the rate limit too (see test_commands_obey_the_rate_limit)
    try:
        fake_llm.reply = "答え😀 " * 300  # long multibyte history for !history
        await h.say("שָׁלוֹם 👩‍👩‍👧 " * 200, sender=sender)
        await h.say("!remember " + "長い事実 " * 60, sender=sender)  # 300 chars, 3 bytes each
        conv = await h.store.conversation(h.transport_key(sender))
        await h.store.save_summary(conv.id, text="要約😀 " * 400, first_message_id=1,
                                   last_message_id=2, tokens=800)  # fmt: skip
        llm_calls = len(fake_llm.chat_requests())
        covered = set()
        for call in COMMAND_CALLS:
            await h.say(call, sender=sender)
            reply = h.transport.sent[-1]
            assert reply.kind is ReplyKind.COMMAND, call
            size = len(reply.text.encode("utf-8"))
            assert 0 < size <= 200, (call, size, reply.text)
            parsed = h.app.commands.parse(call)
            assert parsed is not None
            covered.add(parsed[0])
        assert set(h.app.commands.names) <= covered
        assert len(fake_llm.chat_requests()) == llm_calls
    finally:
        await h.app.close()


async def test_unknown_and_bad_arguments_say_how_to_fix(harness: Harness) -> None:
    await harness.say("!frobnicate")
    assert _last(harness) == "Unknown command !frobnicate. Send !help."
    await harness.say("!history lots")
    assert _last(harness).startswith("Usage: !history [n]")
    await harness.say("!remember")
    assert _last(harness).startswith("Usage: !remember <fact>")
    await harness.say("!unremember 3")
    assert _last(harness) == "No facts to remove. Add one with !remember <fact>."


async def test_remember_facts_unremember(harness: Harness) -> None:
    await harness.say("!remember I am vegetarian")
    await harness.say("!remember My radio is a T-Beam")
    await harness.say("!facts")
    assert _last(harness) == "1) I am vegetarian [you, today] 2) My radio is a T-Beam [you, today]"
    harness.llm.reply = "ok"
    await harness.say("what should I eat?")
    system = harness.llm.chat_requests()[-1]["messages"][0]["content"]
    assert "I am vegetarian" in system and "T-Beam" in system
    await harness.say("!unremember 1")
    assert _last(harness) == "Removed fact 1 and its history; 1 left (!facts)."
    await harness.say("!facts")
    assert _last(harness) == "1) My radio is a T-Beam [you, today]"


async def test_reset_forgets_context_but_keeps_facts(harness: Harness) -> None:
    harness.llm.reply = "noted"
    await harness.say("!remember I live in Oslo")
    await harness.say("my secret word is pineapple")
    await harness.say("!reset")
    assert _last(harness) == (
        "Fresh start: nothing said before now is used again. Kept: 1 fact you asked me to "
        "remember (!facts). Old messages stay stored (!forget deletes them)."
    )
    await harness.say("what was my secret word pineapple?")
    prompt = harness.llm.chat_requests()[-1]["messages"]
    joined = "\n".join(m["content"] for m in prompt[:-1])
    assert "my secret word is pineapple" not in joined  # not in window, nor retrieved
    assert "I live in Oslo" in prompt[0]["content"]
    await harness.say("!history 10")
    assert "my secret word is pineapple" not in _last(harness)
    assert (await harness.store.stats())["messages"] >= 2  # reset hides the log, keeps it


async def test_reset_without_facts_says_none_are_kept(harness: Harness) -> None:
    await harness.say("!reset")
    assert "Kept: no facts (none pinned). Old messages stay stored" in _last(harness)


async def test_forget_needs_confirmation_within_60s(tmp_path: Path, fake_llm: FakeLLM) -> None:
    now = [1000.0]
    h = await start_harness(tmp_path, fake_llm)
    h.app.commands._clock = lambda: now[0]
    try:
        await h.say("hello there")
        await h.say("!forget yes")
        assert _last(h).startswith("Nothing to confirm")
        await h.say("!forget")
        assert "within 60 s" in _last(h)
        now[0] += 61
        await h.say("!forget yes")
        assert _last(h).startswith("Nothing to confirm")
        assert (await h.store.stats())["messages"] == 2
        await h.say("!forget")
        now[0] += 30
        await h.say("!forget yes")
        assert _last(h).startswith("Deleted everything I kept about you: 2 messages")
    finally:
        await h.app.close()


async def test_forget_deletes_every_row_about_the_person_only(harness: Harness) -> None:
    harness.llm.reply = "sure thing about zebras"
    await harness.say("zebras are my favourite", sender="alice")
    await harness.say("!remember I like zebras", sender="alice")
    await harness.say("zebras in a channel", sender="alice", space="ch0")
    await harness.say("zebras for bob", sender="bob")
    conv = await harness.store.conversation(harness.transport_key("alice"))
    await harness.store.save_summary(
        conv.id, text="alice likes zebras", first_message_id=1, last_message_id=2, tokens=4
    )
    await harness.say("!forget", sender="alice")
    await harness.say("!forget yes", sender="alice")
    db = harness.store
    rows = await db._all(
        "SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id "
        "WHERE c.person = 'alice'"
    )
    assert rows[0][0] == 0
    for table in ("summaries", "facts"):
        assert (await db._all(f"SELECT count(*) FROM {table}"))[0][0] == 0
    assert (await db._all("SELECT count(*) FROM conversations WHERE person='alice'"))[0][0] == 0
    # Index rows: only bob's two messages still match.
    hits = await db._all("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'zebras'")
    bob = await db._all(
        "SELECT c.id * 4294967296 + m.id FROM messages m JOIN conversations c "
        "ON c.id = m.conversation_id WHERE c.person = 'bob'"
    )
    assert sorted(r[0] for r in hits) == sorted(r[0] for r in bob)


async def test_operator_commands_are_gated(tmp_path: Path, fake_llm: FakeLLM) -> None:
    h = await start_harness(tmp_path, fake_llm, extra='bot:\n  operators: ["fake:root"]\n')
    try:
        await h.say("!stats", sender="mallory")
        assert _last(h).startswith("Unknown command !stats")
        await h.say("!stats", sender="root")
        assert _last(h).startswith("conversations:")
    finally:
        await h.app.close()


async def test_export_attaches_markdown_and_json(harness: Harness) -> None:
    harness.llm.reply = "hello alice"
    await harness.say("hi, export me later")
    await harness.say("!export")
    reply = harness.transport.sent[-1]
    names = sorted(a.filename for a in reply.attachments)
    assert names == ["meshsage-export-fake.json", "meshsage-export-fake.md"]
    md = next(a.data.decode() for a in reply.attachments if a.filename.endswith(".md"))
    assert "hi, export me later" in md and "hello alice" in md
    assert all(a.dm_only for a in reply.attachments)


@pytest.mark.parametrize("text", ["!", "!!!", "! help", "!?"])
async def test_non_commands_go_to_the_llm(harness: Harness, text: str) -> None:
    harness.llm.reply = "llm"
    await harness.say(text)
    if text == "! help":
        assert _last(harness).startswith("Commands:")
    else:
        assert _last(harness) == "llm"


async def test_forget_leaves_none_of_the_words_in_the_database_files(harness: Harness) -> None:
    secret = "xylophonequartz"
    harness.llm.reply = "noted"
    await harness.say(f"my password is {secret}", sender="alice")
    bob = await harness.store.conversation(harness.transport_key("bob"))
    for i in range(300):  # later index segments, so alice's stays unmerged
        text = f"bob talks about weather {i}"
        await harness.store.add_message(bob.id, role="user", author="bob", text=text, tokens=5,
                                        status="x")  # fmt: skip
    await harness.say("!forget", sender="alice")
    await harness.say("!forget yes", sender="alice")
    assert _last(harness).startswith("Deleted everything I kept about you: 2 messages")
    path = harness.store.path
    files = [f for f in path.parent.iterdir() if f.name.startswith(path.name)]
    raw = b"".join(f.read_bytes() for f in files)
    # Porter stems the word in the index; neither the text nor the stem may stay behind.
    assert secret.encode() not in raw and secret[:-2].encode() not in raw
    assert (await harness.store.stats())["messages"] == 300  # bob keeps everything


async def test_status_in_a_channel_counts_nothing_from_the_dms(harness: Harness) -> None:
    for text in ("one", "two", "three"):
        await harness.say(text)  # DMs
    await harness.say("in the channel", space="ch7")
    await harness.say("!status", space="ch7")
    assert _last(harness).endswith("you sent 1 message here.")
    await harness.say("!status")
    assert _last(harness).endswith("you sent 4 messages.")  # a DM sees the whole transport


async def test_forget_in_a_channel_prints_no_counts(harness: Harness) -> None:
    """The counts include what was said in DMs: a shared channel must not see them."""
    await harness.say("a secret in a DM", sender="alice")
    await harness.say("!forget", sender="alice", space="ch0")
    await harness.say("!forget yes", sender="alice", space="ch0")
    last = _last(harness)
    assert last == "Deleted everything I kept about you. I no longer remember you."
    assert not any(ch.isdigit() for ch in last)


@pytest.mark.parametrize(("name", "limit"), [("discord", 2000), ("console", None)])
async def test_command_replies_use_the_transports_own_size(
    tmp_path: Path, fake_llm: FakeLLM, name: str, limit: int | None
) -> None:
    h = await start_harness(
        tmp_path, fake_llm, transport=FakeTransport(name=name, byte_limit=limit)
    )
    try:
        await h.say("hello")
        conv = await h.store.conversation(h.transport_key("alice"))
        summary = "They planned a long trip along the coast. " * 30  # about 1,300 bytes
        await h.store.save_summary(conv.id, text=summary.strip(), first_message_id=1,
                                   last_message_id=2, tokens=300)  # fmt: skip
        await h.say("!summary")
        assert h.transport.sent[-1].text == "Summary: " + summary.strip()  # not cut to 200
        await h.store.save_summary(conv.id, text="x " * 3000, first_message_id=1,
                                   last_message_id=2, tokens=3000)  # fmt: skip
        await h.say("!summary")
        size = len(h.transport.sent[-1].text.encode("utf-8"))
        assert size <= (limit or 20_000) and size > 2000 - 10
    finally:
        await h.app.close()


def test_channel_trigger_list_names_every_command(harness: Harness) -> None:
    from bot.commands import COMMAND_NAMES

    assert set(COMMAND_NAMES) == set(harness.app.commands.names)


async def test_odd_numbers_get_the_usage_line_never_an_exception(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(
        tmp_path, fake_llm, extra="bot:\n  rate_limit: {messages: 100, per_seconds: 60}\n"
    )
    try:
        await h.say("!unremember 1")  # no facts at all
        assert _last(h).startswith("No facts to remove.")
        await h.say("!remember I like tea")
        for arg in ("③", "²", "-1", "99999999999999999999", "1.5"):
            await h.say(f"!unremember {arg}")
            assert _last(h).startswith("Usage: !unremember <n>"), arg
            await h.say(f"!history {arg}")
            assert _last(h).startswith("Usage: !history [n]"), arg
    finally:
        await h.app.close()


async def test_incognito_says_whole_what_it_keeps_and_keeps_it(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    """The `!incognito` reply names every promise (not stored, never recalled, held only until
    `!incognito off`, `!reset`, `!forget` or a restart; what `!incognito off` does), whole in
    one mesh packet; and each promise holds: the secret is in no stored row and, after
    `!incognito off`, in no later request."""
    h = await start_harness(tmp_path, fake_llm, transport=FakeTransport(name="meshtastic"))
    try:
        fake_llm.reply = "ok"
        await h.say("hello there")
        await h.say("!incognito")
        on = _last(h)
        assert on == (
            "Incognito on: your new messages here and my answers are not stored or ever "
            "recalled. I hold them only until !incognito off (forgets them, then stores "
            "again), !reset, !forget or a restart."
        )
        assert len(on.encode("utf-8")) <= 200  # not cut by the mesh packet
        await h.say("my secret is 4242")
        assert "4242" in str(fake_llm.chat_requests()[-1]["messages"])  # held while on
        await h.say("!incognito off")
        assert _last(h) == (
            "Incognito off: what you said while incognito is forgotten; I store our new "
            "messages again."
        )
        await h.say("what is new")
        assert "4242" not in str(fake_llm.chat_requests()[-1]["messages"])  # forgotten
        conv = await h.store.conversation(h.transport_key("alice"))
        stored = [m.text for m in await h.store.all_messages(conv.id)]
        assert "what is new" in stored and not any("4242" in t for t in stored)  # stored again
    finally:
        await h.app.close()
