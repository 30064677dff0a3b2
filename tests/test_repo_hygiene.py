"""Repository hygiene: no tracked file keeps a merge-conflict marker.

A resolved merge once left ``<<<<<<< HEAD`` ... ``>>>>>>> main`` in a docstring of
bot/memory/port.py; nothing failed, because it sat inside a string. Markers are git's own: a line
starting with seven ``<`` or ``>`` (then a space or the line's end), or a line of exactly seven
``=``. Files are the tracked ones (``git ls-files``); outside a git checkout (an unpacked
archive), every file under the repository root except the virtualenv and caches.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(rb"^(?:<{7}|>{7})(?: |$)|^={7}$", re.MULTILINE)
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _tracked() -> list[Path]:
    git = shutil.which("git")
    if git is not None and (ROOT / ".git").exists():
        out = subprocess.run(
            [git, "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        return [ROOT / name.decode() for name in out.split(b"\0") if name]
    return [
        p for p in ROOT.rglob("*") if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)
    ]


def markers_in(data: bytes) -> list[int]:
    """1-based line numbers of conflict markers in ``data`` (CRLF lines included)."""
    text = data.replace(b"\r\n", b"\n")
    return [text.count(b"\n", 0, m.start()) + 1 for m in MARKER.finditer(text)]


def test_the_marker_pattern_finds_what_git_writes_and_nothing_else() -> None:
    conflict = b"a\n<<<<<<< HEAD\nmine\n=======\ntheirs\n>>>>>>> main\nb\n"
    assert markers_in(conflict) == [2, 4, 6]
    assert markers_in(b"x\r\n<<<<<<< ours\r\n=======\r\n>>>>>>> theirs\r\n") == [2, 3, 4]
    # not markers: longer rules, an underline of another length, arrows inside a line
    assert markers_in(b"Title\n========\nx <<<<<<< y\n>>>>>>>> 8\n==\n") == []


def test_no_tracked_file_has_a_merge_conflict_marker() -> None:
    found = []
    for path in _tracked():
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        found += [f"{path.relative_to(ROOT)}:{line}" for line in markers_in(data)]
    assert not found, (
        "merge-conflict markers left in tracked files (resolve the merge, then remove them): "
        + ", ".join(found)
    )
