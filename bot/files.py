"""Private state files: the state dir is 0700, the database, its WAL/SHM, exports, backups and
the status file 0600, whatever the process umask.

Invariants: only paths this user owns are changed, and a refused chmod (immutable or read-only
directory) is not an error here (a state dir pointed at someone else's
directory is reported by the preflight, never silently re-permissioned).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) if needed; make it 0700 if this user owns it."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    _tighten(path, DIR_MODE)


def private_file(path: Path) -> None:
    """Create ``path`` empty if missing (so SQLite's WAL/SHM inherit 0600); make it 0600."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    _tighten(path, FILE_MODE)


def tighten_if_present(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        _tighten(path, FILE_MODE)


def _tighten(path: Path, mode: int) -> None:
    st = path.stat()
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != mode:
        # Best effort: an immutable or read-only-mounted directory refuses; whether the bot
        # can still write there is checked (and explained) by the caller.
        with contextlib.suppress(PermissionError):
            os.chmod(path, mode)
