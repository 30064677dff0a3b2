"""`meshsage backup` into a directory accumulates dated files (keep the newest N), never
overwrites a file without --force, and says in one line what to do when it cannot (missing
directory, full disk), losing no earlier backup."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.cli import main
from bot.memory.store import SqliteStore


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
async def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MESHSAGE_STATE_DIR", str(tmp_path / "state"))
    store = await SqliteStore.open(tmp_path / "state" / "meshsage.db")
    await store.close()
    return tmp_path / "state" / "meshsage.db"


async def test_two_backups_a_second_apart_are_two_files(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "var" / "backups"  # does not exist yet: the trailing slash says "dir"
    assert main(["backup", f"{target}/"]) == 0
    time.sleep(1.1)
    assert main(["backup", f"{target}/"]) == 0
    made = sorted(target.glob("meshsage-*.db"))
    assert len(made) == 2, made
    assert _mode(target) == 0o700 and all(_mode(p) == 0o600 for p in made)
    out = capsys.readouterr().out
    assert out.count("integrity ok") == 2
    # A plain existing directory (no slash) is a directory too.
    assert main(["backup", str(target)]) == 0
    assert len(list(target.glob("meshsage-*.db"))) == 3


async def test_backups_in_one_second_do_not_replace_each_other_and_keep_prunes(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "b"
    target.mkdir()
    (target / "notes.txt").write_text("mine")  # not a backup: never pruned
    for _ in range(5):
        assert main(["backup", str(target), "--keep", "3"]) == 0
    kept = sorted(target.glob("meshsage-*.db"))
    assert len(kept) == 3, kept
    printed = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    assert [Path(p) for p in printed[-3:]] == sorted(kept, key=lambda p: printed.index(str(p)))
    assert (target / "notes.txt").read_text() == "mine"
    assert main(["backup", str(target)]) == 0  # default keep 7
    assert len(list(target.glob("meshsage-*.db"))) == 4


async def test_a_file_is_never_overwritten_without_force(
    tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "one.db"
    dest.write_bytes(b"precious")
    assert main(["backup", str(dest)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and "--force" in err
    assert dest.read_bytes() == b"precious"
    assert main(["backup", str(dest), "--force"]) == 0
    assert dest.read_bytes().startswith(b"SQLite format 3")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["{tmp}/missing/parent/file.db"], ["does not exist", "end the path with a slash"]),
        (["{tmp}/x/", "--keep", "0"], ["--keep", "1 or more"]),
    ],
    ids=["missing-parent", "keep-zero"],
)
async def test_bad_targets_get_one_line_with_the_fix(
    tmp_path: Path,
    state: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: list[str],
) -> None:
    argv = ["backup", *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse refuses a bad --keep with its usage line (exit 2)
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc in (2, 3) and "Traceback" not in err
    for word in words:
        assert word in err, err


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real small filesystem (tmpfs) to fill; needs root (CI runs as root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    yield mount
    subprocess.run(["umount", str(mount)], check=False, capture_output=True)


async def test_a_full_disk_keeps_the_earlier_backups(
    tmp_path: Path, state: Path, tiny_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    size = state.stat().st_size
    room = (size * 3 // 2) // 4096 * 4096 + 4096  # one backup fits, a second does not
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={room},mode=0700", "tmpfs", str(tiny_disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}); CI runs as root")
    assert main(["backup", str(tiny_disk)]) == 0
    first = sorted(tiny_disk.glob("meshsage-*.db"))
    before = first[0].read_bytes()
    time.sleep(1.1)
    assert main(["backup", str(tiny_disk), "--keep", "1"]) == 28  # DiskFull, like ENOSPC
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left" in err and "earlier backups are kept" in err
    assert sorted(tiny_disk.glob("meshsage-*.db")) == first  # not pruned, not replaced
    assert first[0].read_bytes() == before
    assert not [p for p in os.listdir(tiny_disk) if p.endswith(".partial")]


async def test_keep_one_always_keeps_the_backup_just_written(tmp_path: Path, state: Path) -> None:
    # Pruning once freed a name within the same second; the next backup took it, sorted as
    # the oldest and was pruned at once. Each backup here must survive its own pruning.
    from bot.ops.backup import backup

    target = tmp_path / "b"
    for _ in range(6):
        report = backup(state, f"{target}/", keep=1)
        assert report.path.is_file()
        assert list(target.glob("meshsage-*.db")) == [report.path]
