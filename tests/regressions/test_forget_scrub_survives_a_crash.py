"""A kill between ``!forget``'s delete and its index rewrite left the person's words in old
FTS segments for good, and a second ``!forget yes`` ("0 messages") skipped the rewrite."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.domain import ConversationKey
from bot.memory.store import SqliteStore

KEY = ConversationKey("mesh", "!0000abcd")
WORD = b"zanzibarquokka"


async def _fill(store: SqliteStore) -> None:
    conv = await store.conversation(KEY)
    other = await store.conversation(ConversationKey("mesh", "!0000beef"))
    for i in range(300):  # several FTS segments, so a delete marker alone keeps the words
        await store.add_message(other.id, role="user", author="b", text=f"filler {i} words",
                                tokens=2, status="answered")  # fmt: skip
        if i % 30 == 0:
            await store.add_message(conv.id, role="user", author="a", text=f"my {WORD.decode()}",
                                    tokens=2, status="answered")  # fmt: skip


def _word_on_disk(path: Path) -> bool:
    return any(
        WORD in p.read_bytes() for p in path.parent.iterdir() if p.name.startswith(path.name)
    )


async def test_a_scrub_interrupted_by_a_crash_is_finished_at_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.db"
    store = await SqliteStore.open(path)
    await _fill(store)

    async def killed(self: SqliteStore) -> None:
        raise KeyboardInterrupt("kill -9 here")

    monkeypatch.setattr(SqliteStore, "_erase_deleted", killed)
    with pytest.raises(KeyboardInterrupt):
        await store.forget_person("mesh", KEY.person)
    monkeypatch.undo()
    await store._db.close()  # no tidy close: the process died
    reopened = await SqliteStore.open(path)
    await reopened.close()
    assert not _word_on_disk(path)


async def test_a_repeated_forget_scrubs_again(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await SqliteStore.open(path)
    await _fill(store)
    calls: list[int] = []
    real = SqliteStore._erase_deleted

    async def counting(self: SqliteStore) -> None:
        calls.append(1)
        await real(self)

    SqliteStore._erase_deleted = counting  # type: ignore[method-assign,assignment]
    try:
        await store.forget_person("mesh", KEY.person)
        report = await store.forget_person("mesh", KEY.person)
    finally:
        SqliteStore._erase_deleted = real  # type: ignore[method-assign]
    await store.close()
    assert report.messages == 0 and len(calls) == 2
    assert not _word_on_disk(path)


async def test_forget_in_the_console_deletes_the_export_files_too(tmp_path: Path) -> None:
    from bot.transports.console import ConsoleTransport
    from tests.test_cli import _env  # noqa: F401  (same fixtures as the CLI tests)

    async def idle() -> None:
        return None

    console = ConsoleTransport(user="alice", context_tokens=512, max_tokens=50,
                               wait_idle=idle, export_dir=tmp_path)  # fmt: skip
    for name in ("meshsage-export-console.md", "meshsage-export-console.json", "keep.txt"):
        (tmp_path / name).write_text("secret")
    assert console.forget("bob") == 0
    assert console.forget("alice") == 2
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
