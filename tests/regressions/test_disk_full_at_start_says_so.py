"""A full disk at start was reported as a generic I/O error with no fix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from bot.errors import DiskFull
from bot.memory.store import SqliteStore


async def test_disk_full_at_open_is_named_with_its_fix_and_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(aiosqlite, "connect", full)
    with pytest.raises(DiskFull) as err:
        await SqliteStore.open(tmp_path / "m.db")
    assert err.value.exit_code == 28
    assert "is full" in str(err.value) and "Fix: free some space" in str(err.value)
