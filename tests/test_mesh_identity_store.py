"""Key pins in the store (migration 022, both backends): first pin wins, the operator's
re-pin, ``!forget`` removes the pin, the person's export carries it and import restores it,
a SQLite backup holds it, and a held command keeps whether its sender was authenticated."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from bot.domain import ConversationKey
from bot.memory.export import import_document, person_document, render, validate
from bot.memory.port import MemoryStore
from bot.memory.store import SqliteStore
from bot.ops.backup import backup

NODE = "!20000001"
KEY = hashlib.sha256(b"radio one").digest()
NEW = hashlib.sha256(b"radio two").digest()


async def test_the_first_pin_wins_and_only_a_repin_replaces_it(memory: MemoryStore) -> None:
    assert await memory.key_pin("meshtastic", NODE) is None
    assert await memory.pin_key("meshtastic", NODE, KEY) == KEY
    assert await memory.pin_key("meshtastic", NODE, NEW) == KEY  # trust on first use
    assert await memory.pin_key("meshtastic", NODE, NEW, replace=True) == NEW
    [pin] = await memory.key_pins()
    assert (pin.transport, pin.person, pin.public_key) == ("meshtastic", NODE, NEW)
    assert await memory.unpin_key("meshtastic", NODE)
    assert not await memory.unpin_key("meshtastic", NODE)
    assert await memory.key_pins() == []


async def test_forget_removes_the_pin_of_that_person_only(memory: MemoryStore) -> None:
    await memory.pin_key("meshtastic", NODE, KEY)
    await memory.pin_key("meshtastic", "!20000002", NEW)
    await memory.conversation(ConversationKey("meshtastic", NODE))
    await memory.forget_person("meshtastic", NODE)
    assert [p.person for p in await memory.key_pins()] == ["!20000002"]


async def test_the_export_carries_the_pin_and_import_restores_it(
    memory: MemoryStore, tmp_path: Path
) -> None:
    conv = await memory.conversation(ConversationKey("meshtastic", NODE))
    await memory.add_message(conv.id, role="user", author=NODE, text="hello", tokens=1,
                             status="answered")  # fmt: skip
    await memory.pin_key("meshtastic", NODE, KEY, pinned_at=1_700_000_000.0)
    doc = await person_document(memory, "meshtastic", NODE)
    assert doc["key_pin"]["fingerprint"] == hashlib.sha256(KEY).hexdigest()[:16]
    text = render(doc, "json")
    await memory.forget_person("meshtastic", NODE)
    counts = await import_document(memory, validate(doc))
    assert counts["key pin"] == 1
    assert render(await person_document(memory, "meshtastic", NODE), "json") == text
    # a file never replaces a pin someone holds now
    await memory.forget_person("meshtastic", NODE)
    await memory.pin_key("meshtastic", NODE, NEW)
    assert (await import_document(memory, validate(doc)))["key pin"] == 0
    assert (await memory.key_pin("meshtastic", NODE)).public_key == NEW  # type: ignore[union-attr]


async def test_a_person_without_a_pin_exports_as_before(memory: MemoryStore) -> None:
    await memory.conversation(ConversationKey("discord", "42"))
    assert "key_pin" not in await person_document(memory, "discord", "42")


async def test_a_sqlite_backup_holds_the_pins(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        await store.pin_key("meshtastic", NODE, KEY)
    finally:
        await store.close()
    backup(tmp_path / "m.db", tmp_path / "copy.db")
    db = sqlite3.connect(tmp_path / "copy.db")
    try:
        assert db.execute("SELECT person FROM key_pins").fetchall() == [(NODE,)]
    finally:
        db.close()


async def test_a_held_command_keeps_whether_its_sender_was_authenticated(
    memory: MemoryStore,
) -> None:
    key = ConversationKey("meshtastic", NODE)
    await memory.hold_command(key, "!facts", platform_id="1", author=None)
    await memory.hold_command(key, "!forget", platform_id="2", author=None, authenticated=True)
    held = await memory.held_commands(transports=["meshtastic"])
    assert [(h.text, h.authenticated) for h in held] == [("!facts", False), ("!forget", True)]
