"""Export and import: every format, a byte-identical round trip through an empty database,
one-transaction imports that refuse hostile, malformed, too-new, duplicate-id and 100 MB files
without writing anything, and ``!export`` on a transport without files."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.domain import DM_SPACE, ConversationKey, Inbound
from bot.memory.core.portable import ImportRefused
from bot.memory.export import (
    FORMATS,
    ImportFileError,
    import_document,
    person_document,
    read_import,
    render,
)
from bot.memory.store import SqliteStore
from tests.conftest import make_config, start_harness
from tests.fakes.fake_llm import FakeLLM

ALICE = ConversationKey("discord", "1001")
T0 = 1_700_000_000.123456


async def _populate(store: SqliteStore) -> None:
    dm = await store.conversation(ALICE)
    q = await store.add_message(dm.id, role="user", author="alice", text="my cat is Miso «ü»",
                                tokens=5, status="answered", created_at=T0,
                                platform_id="p1")  # fmt: skip
    a = await store.add_message(dm.id, role="assistant", author="bot", text='Miso! "quote"',
                                tokens=3, status="delivered", created_at=T0 + 1.5,
                                parent_id=q, platform_id="p2")  # fmt: skip
    await store.add_message(dm.id, role="user", author="alice", text="reply to you",
                            tokens=3, status="answered", created_at=T0 + 9 * 3600,
                            reply_to_platform_id="p2")  # fmt: skip
    await store.add_session(dm.id, first_message_id=q, last_message_id=a, started_at=T0,
                            ended_at=T0 + 1.5, messages=2)  # fmt: skip
    [s] = await store.sessions(dm.id)
    await store.set_session_summary(s.id, title="Cats", summary="About Miso.", tokens=3)
    await store.save_longterm_summary(dm.id, text="Has a cat.", tokens=3, sessions=1,
                                      up_to_message_id=a, updated_at=T0 + 5)  # fmt: skip
    await store.save_summary(dm.id, text="rolling", first_message_id=q, last_message_id=a,
                             tokens=1)  # fmt: skip
    await store.add_fact(dm.id, text="Cat named Miso", tokens=3, pinned=False, source_ids=[q],
                         created_at=T0 + 2)  # fmt: skip
    pinned = await store.add_fact(dm.id, text="pinned one", tokens=2, created_at=T0 + 3)
    await store.revise_fact(dm.id, pinned, text="pinned two", tokens=2, pinned=True,
                            source_ids=[a], updated_at=T0 + 4)  # fmt: skip
    await store.mark_important(dm.id, [a])
    await store.note_retrieved([q])
    await store.note_retrieved([q])
    ch = await store.conversation(ConversationKey("discord", "1001", "guild:1/chan:2"))
    await store.add_message(ch.id, role="user", author="alice", text="in the channel",
                            tokens=3, status="answered", created_at=T0 + 100)  # fmt: skip
    bob = await store.conversation(ConversationKey("discord", "2002"))
    await store.add_message(bob.id, role="user", author="bob", text="BOB SECRET", tokens=2,
                            status="answered", created_at=T0)  # fmt: skip


def _counts(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        tables = ["conversations", "messages", "summaries", "sessions", "facts",
                  "longterm_summaries", "messages_fts_docsize"]  # fmt: skip
        return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    finally:
        db.close()


async def test_export_import_export_is_byte_identical_in_every_format(tmp_path: Path) -> None:
    one = await SqliteStore.open(tmp_path / "one.db")
    await _populate(one)
    doc = await person_document(one, "discord", "1001")
    first = {fmt: render(doc, fmt) for fmt in FORMATS}
    await one.close()
    assert "BOB SECRET" not in first["json"]
    exported = json.loads(first["json"])
    dm = exported["conversations"][0]
    assert dm["messages"][1]["parent_id"] == dm["messages"][0]["id"]  # reply links
    assert dm["messages"][0]["platform_id"] == "p1" and dm["messages"][0]["uses"] == 2
    assert dm["facts"][0]["source_ids"] == [dm["messages"][0]["id"]]  # provenance
    assert dm["facts"][0]["created_at"] == T0 + 2  # dates kept exactly
    assert dm["sessions"][0]["title"] == "Cats"
    assert dm["facts"][0]["history"] == []
    assert dm["facts"][1]["history"] == [  # the value it replaced, with its provenance
        {"text": "pinned one", "until": T0 + 4, "pinned": True, "source_ids": []}
    ]

    path = tmp_path / "alice.json"
    path.write_text(first["json"], encoding="utf-8")
    two = await SqliteStore.open(tmp_path / "two.db")
    counts = await import_document(two, read_import(path))
    assert counts == {"conversations": 2, "messages": 4, "summaries": 1, "sessions": 1,
                      "facts": 2}  # fmt: skip
    again = await person_document(two, "discord", "1001")
    for fmt in FORMATS:
        assert render(again, fmt) == first[fmt], fmt
    # Imported messages are searchable like any other.
    conv = await two.conversation(ALICE)
    assert await two.search_terms(conv.id, ["miso"], after_id=0, before_id=1 << 40)
    await two.close()

    lines = [json.loads(x) for x in first["jsonl"].splitlines()]
    assert lines[0]["messages"] == [
        {"role": "user", "content": "my cat is Miso «ü»"},
        {"role": "assistant", "content": 'Miso! "quote"'},
    ]
    assert "m1 --> m2" in first["mermaid"] and "#quot;quote#quot;" in first["mermaid"]
    assert "### " in first["md"] and "Cats" in first["md"] and "Cat named Miso" in first["md"]
    assert "  - before: pinned one (yours, until 2023-11-14T22:13:24+00:00)" in first["md"]


async def test_an_export_written_before_fact_history_still_imports(tmp_path: Path) -> None:
    one = await SqliteStore.open(tmp_path / "one.db")
    await _populate(one)
    doc = await person_document(one, "discord", "1001")
    await one.close()
    for conv in doc["conversations"]:
        for fact in conv["facts"]:
            del fact["history"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    two = await SqliteStore.open(tmp_path / "two.db")
    try:
        await import_document(two, read_import(path))
        conv = await two.conversation(ALICE)
        assert [f.history for f in await two.facts(conv.id)] == [(), ()]
    finally:
        await two.close()


def _bad_docs(doc: dict[str, Any]) -> dict[str, Any]:
    import copy

    def edit(fn: Any) -> dict[str, Any]:
        d = copy.deepcopy(doc)
        fn(d)
        return d

    def msgs(d: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = d["conversations"][0]["messages"]
        return rows

    return {
        "too new": edit(lambda d: d.update(version=99)),
        "not ours": edit(lambda d: d.update(format="something-else")),
        "duplicate message ids": edit(lambda d: msgs(d).append(dict(msgs(d)[0]))),
        "duplicate conversation ids": edit(
            lambda d: d["conversations"][1].update(id=d["conversations"][0]["id"])
        ),
        "wrong types": edit(lambda d: msgs(d)[0].update(tokens="many")),
        "bool as id": edit(lambda d: msgs(d)[0].update(id=True)),
        "missing field": edit(lambda d: msgs(d)[0].pop("text")),
        "bad role": edit(lambda d: msgs(d)[0].update(role="system")),
        "dangling reply": edit(lambda d: msgs(d)[1].update(parent_id=123456)),
        "not a list": edit(lambda d: d.update(conversations={"a": 1})),
        "space not a string": edit(lambda d: d["conversations"][0].update(space=1)),
        "bad fact history": edit(
            lambda d: d["conversations"][0]["facts"][1]["history"][0].update(until="then")
        ),
    }


async def test_bad_import_files_get_a_clear_error_and_write_nothing(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "src.db")
    await _populate(store)
    doc = json.loads(render(await person_document(store, "discord", "1001"), "json"))
    await store.close()
    target = await SqliteStore.open(tmp_path / "target.db")
    await target.close()
    before = _counts(tmp_path / "target.db")
    for name, bad in _bad_docs(doc).items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(ImportFileError, match="cannot be imported") as err:
            read_import(path)
        assert "Nothing was written" in str(err.value), name
    assert "newer meshsage" in _message(tmp_path, _bad_docs(doc)["too new"])
    assert "appears twice" in _message(tmp_path, _bad_docs(doc)["duplicate message ids"])
    # Not JSON; an export in another format; a 100 MB file (sparse: nothing is read).
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\x00\xff{{{")
    with pytest.raises(ImportFileError, match="not a JSON export"):
        read_import(junk)
    huge = tmp_path / "huge.json"
    with huge.open("wb") as fh:
        fh.truncate(100 * 1024 * 1024)
    with pytest.raises(ImportFileError, match="100 MB"):
        read_import(huge)
    assert _counts(tmp_path / "target.db") == before


def _message(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "one-bad.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ImportFileError) as err:
        read_import(path)
    return str(err.value)


async def test_import_is_one_transaction_when_ids_are_taken(tmp_path: Path) -> None:
    src = await SqliteStore.open(tmp_path / "src.db")
    await _populate(src)
    doc = json.loads(render(await person_document(src, "discord", "1001"), "json"))
    await src.close()
    target = await SqliteStore.open(tmp_path / "target.db")
    # Someone else's message already holds one of the ids the file uses (the channel one).
    other = await target.conversation(ConversationKey("mesh", "!beef"))
    for i in range(4):
        await target.add_message(other.id, role="user", author="x", text=f"t{i}", tokens=1,
                                 status="answered")  # fmt: skip
    before = _counts(tmp_path / "target.db")
    with pytest.raises(ImportRefused, match="already"):
        await import_document(target, doc)
    await target.close()
    assert _counts(tmp_path / "target.db") == before


async def test_cli_export_and_import(tmp_path: Path, fake_llm: FakeLLM,
                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    config = make_config(tmp_path, fake_llm.base_url)
    store = await SqliteStore.open(config.database_path)
    await _populate(store)
    await store.close()
    cfg = str(tmp_path / "config.yaml")
    assert await asyncio.to_thread(
        main, ["export", "1001", "--transport", "discord", "--format", "json", "--config", cfg]
    ) == 0  # fmt: skip
    out = capsys.readouterr().out
    dump = tmp_path / "dump.json"
    dump.write_text(out, encoding="utf-8")
    assert await asyncio.to_thread(main, ["import", str(dump), "--config", cfg]) == 1
    assert "already has a conversation" in capsys.readouterr().err  # same database: refused
    (tmp_path / "v2.json").write_text(json.dumps({**json.loads(out), "version": 2}))
    assert await asyncio.to_thread(main, ["import", str(tmp_path / "v2.json"), "--config",
                                          cfg]) == 1  # fmt: skip
    assert "newer meshsage" in capsys.readouterr().err


async def test_export_command_on_the_mesh_says_how_to_get_it(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    h = await start_harness(tmp_path, fake_llm)
    try:
        inbound = Inbound(transport="meshtastic", sender="!1234abcd", space=DM_SPACE,
                          text="!export", authenticated=True)  # a PKI DM  # fmt: skip
        result = await h.app.commands.run(inbound, "export", "")
        assert not result.attachments
        assert "meshsage export !1234abcd" in result.text and "cannot travel" in result.text
        assert len(result.text.encode()) <= 200
    finally:
        await h.app.close()
