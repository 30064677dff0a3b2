"""Every export format reads back (issue 42): JSON and JSONL whole (JSON -> JSONL -> import ->
JSON gives the same bytes), Markdown with every turn, date (to the second) and fact and a
list of what it cannot carry, Mermaid refused as write-only; old or foreign files refused with
the fix. Through ``meshsage import`` where the operator sees the words."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bot.cli import main
from bot.memory.export import FORMATS, ImportFileError, import_document, person_document, render
from bot.memory.export_read import MARKDOWN_LOSES, read_export
from bot.memory.store import SqliteStore
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.test_memory_export import ALICE, T0, _populate


async def _exported(tmp_path: Path, fmt: str) -> tuple[str, str]:
    """(json, fmt) renderings of alice's memory."""
    store = await SqliteStore.open(tmp_path / "src.db")
    await _populate(store)
    doc = await person_document(store, "discord", "1001")
    await store.close()
    return render(doc, "json"), render(doc, fmt)


async def _reimport(tmp_path: Path, name: str, text: str) -> tuple[str, tuple[str, ...]]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    imported = read_export(path)
    target = await SqliteStore.open(tmp_path / f"{name}.db")
    await import_document(target, imported.doc)
    again = await person_document(target, "discord", "1001")
    await target.close()
    return render(again, "json"), imported.lost


async def test_import_jsonl_round_trip_keeps_every_byte_of_the_json(tmp_path: Path) -> None:
    first, jsonl = await _exported(tmp_path, "jsonl")
    lines = [json.loads(x) for x in jsonl.splitlines()]
    # The fine-tuning view is what it was: one answered session, starting with the person.
    assert [line.get("messages") for line in lines] == [[
        {"role": "user", "content": "my cat is Miso «ü»"},
        {"role": "assistant", "content": 'Miso! "quote"'},
    ]]  # fmt: skip
    again, lost = await _reimport(tmp_path, "alice.jsonl", jsonl)
    assert lost == ()
    assert again == first  # every turn (the unanswered ones too), date, fact, summary, session
    doc = json.loads(again)
    assert [m["text"] for c in doc["conversations"] for m in c["messages"]] == [
        "my cat is Miso «ü»", 'Miso! "quote"', "reply to you", "in the channel"]  # fmt: skip
    assert doc["conversations"][0]["facts"][1]["history"][0]["until"] == T0 + 4


async def test_import_jsonl_of_a_person_never_answered(tmp_path: Path) -> None:
    src = await SqliteStore.open(tmp_path / "src.db")
    conv = await src.conversation(ALICE)
    await src.add_message(conv.id, role="user", author="alice", text="hello?", tokens=1,
                          status="answered", created_at=T0)  # fmt: skip
    doc = await person_document(src, "discord", "1001")
    await src.close()
    jsonl = render(doc, "jsonl")
    assert "messages" not in json.loads(jsonl)  # no example to train on, the rows still travel
    again, _ = await _reimport(tmp_path, "quiet.jsonl", jsonl)
    assert again == render(doc, "json")


async def test_import_jsonl_plain_fine_tuning_file_is_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "old.jsonl"
    plain.write_text('{"messages": [{"role": "user", "content": "hi"}, '
                     '{"role": "assistant", "content": "yo"}]}\n')  # fmt: skip
    with pytest.raises(ImportFileError) as err:
        read_export(plain)
    assert 'no "meshsage" record' in str(err.value)
    assert "no person, transport, dates" in str(err.value)
    assert "--format jsonl" in str(err.value)


async def test_import_markdown_keeps_turns_dates_facts_and_says_what_it_lost(
    tmp_path: Path, fake_llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    first, md = await _exported(tmp_path, "md")
    config = make_config(tmp_path, fake_llm.base_url)
    path = tmp_path / "alice.md"
    path.write_text(md, encoding="utf-8")
    cfg = str(tmp_path / "config.yaml")
    assert await asyncio.to_thread(main, ["import", str(path), "--config", cfg]) == 0
    err = capsys.readouterr().err
    assert "imported discord:1001" in err
    for lost in MARKDOWN_LOSES:
        assert f"not in a md export, so not imported: {lost}" in err
    store = await SqliteStore.open(config.database_path)
    again = json.loads(render(await person_document(store, "discord", "1001"), "json"))
    await store.close()
    want = json.loads(first)
    for old, new in zip(want["conversations"], again["conversations"], strict=True):
        assert new["space"] == old["space"]
        assert [(m["id"], m["role"], m["author"], m["text"], int(m["created_at"]))
                for m in new["messages"]] == [
            (m["id"], m["role"], m["author"], m["text"], int(m["created_at"]))
            for m in old["messages"]]  # fmt: skip
        assert [(f["text"], f["pinned"], f["source_ids"], f["history"]) for f in new["facts"]] == [
            (f["text"], f["pinned"], [] if f["pinned"] else f["source_ids"],
             [{**h, "until": int(h["until"])} for h in f["history"]])
            for f in old["facts"]]  # fmt: skip
        assert [(s["title"], s["summary"], s["first_message_id"], s["last_message_id"])
                for s in new["sessions"]] == [
            (s["title"], s["summary"], s["first_message_id"], s["last_message_id"])
            for s in old["sessions"]]  # fmt: skip
        assert [s["text"] for s in new["summaries"]] == [s["text"] for s in old["summaries"]]
        assert (new["longterm_summary"] or {}).get("text") == (
            old["longterm_summary"] or {}).get("text")  # fmt: skip
    # What it read it writes again: the transcript is the same.
    store = await SqliteStore.open(config.database_path)
    assert render(await person_document(store, "discord", "1001"), "md") == md
    await store.close()


async def test_import_markdown_multiline_message(tmp_path: Path) -> None:
    src = await SqliteStore.open(tmp_path / "src.db")
    conv = await src.conversation(ALICE)
    await src.add_message(conv.id, role="user", author="alice", text="line one\n\nline three",
                          tokens=3, status="answered", created_at=T0)  # fmt: skip
    md = render(await person_document(src, "discord", "1001"), "md")
    await src.close()
    path = tmp_path / "multi.md"
    path.write_text(md, encoding="utf-8")
    [conv_doc] = read_export(path).doc["conversations"]
    assert [m["text"] for m in conv_doc["messages"]] == ["line one\n\nline three"]


async def test_import_markdown_written_without_roles_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "old.md"
    old.write_text("# meshsage export for 1001 (discord)\n\n## Space: dm\n\n### Current session\n"
                   "\n**alice** (2023-11-14T22:13:20+00:00): hi\n")  # fmt: skip
    with pytest.raises(ImportFileError, match="names no role or id"):
        read_export(old)


async def test_import_mermaid_is_refused_as_write_only(tmp_path: Path) -> None:
    _, mermaid = await _exported(tmp_path, "mermaid")
    path = tmp_path / "alice.mmd"
    path.write_text(mermaid, encoding="utf-8")
    with pytest.raises(ImportFileError) as err:
        read_export(path)
    assert "Mermaid is write-only" in str(err.value)
    assert "import the JSON, JSONL or Markdown export" in str(err.value)


async def test_import_json_reads_as_before(tmp_path: Path) -> None:
    first, _ = await _exported(tmp_path, "json")
    again, lost = await _reimport(tmp_path, "alice.json", first)
    assert again == first and lost == ()
    assert "mermaid" in FORMATS


async def test_import_jsonl_through_the_cli_loses_nothing(
    tmp_path: Path, fake_llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    first, jsonl = await _exported(tmp_path, "jsonl")
    config = make_config(tmp_path, fake_llm.base_url)
    path = tmp_path / "alice.jsonl"
    path.write_text(jsonl, encoding="utf-8")
    cfg = str(tmp_path / "config.yaml")
    assert await asyncio.to_thread(main, ["import", str(path), "--config", cfg]) == 0
    err = capsys.readouterr().err
    assert "imported discord:1001: 2 conversations, 4 messages" in err
    assert "not imported" not in err
    store = await SqliteStore.open(config.database_path)
    assert render(await person_document(store, "discord", "1001"), "json") == first
    await store.close()
