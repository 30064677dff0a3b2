"""Backups and restores of the SQLite memory, and the lock that says "the bot is running".

Invariants:
- A backup into a directory gets a new dated name (never replacing one) and keeps the newest
  N; to a file path it never overwrites without ``force``; old backups are pruned only after
  the new one is complete, so a full disk loses nothing.
- "Newest" is the order the backups were written in (``ORDER_FILE`` in the directory, one name
  a line, appended once a backup is complete), never the date in a name: a Pi whose clock ran
  30 days behind names its new backups as if they were old, and they are still the newest.
  Dated files the order does not list (written before it existed, copied in) are older than
  every listed one, ordered by their names.
- ``backup`` uses SQLite's online backup API in one step: a consistent snapshot taken while the
  bot keeps writing (WAL readers do not block the writer). The copy is a single self-contained
  file (journal mode DELETE), passes ``integrity_check`` before it is renamed into place, and is
  0600.
- ``restore`` refuses while a bot holds the run lock, checks the backup's integrity and that it
  is a meshsage database first, saves the current database aside (``.before-restore-<time>``),
  removes the old WAL/SHM *before* the new file takes the name (a stale WAL must never be
  applied to a different database), and holds the lock throughout so no bot starts mid-restore.
- ``RunLock`` is an advisory ``flock`` on ``meshsage.lock`` in the state dir, taken by ``run``
  and ``chat`` for the life of the process; the kernel drops it when the process dies, so a
  crashed bot never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from bot.errors import DiskFull, StorageError
from bot.files import private_dir, private_file
from bot.ops.status import write_atomic

LOCK_FILE = "meshsage.lock"


class RunLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``StorageError`` naming the process that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StorageError(
                f"another meshsage process{f' (pid {holder})' if holder else ''} is using "
                f"{self.path.parent}. Fix: stop it first (sudo systemctl stop meshsage, or "
                "Ctrl-C in its terminal), or give this one its own state_dir."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or "0") or None
    return None


@dataclass(frozen=True)
class BackupReport:
    path: Path
    bytes: int
    messages: int


KEEP_DEFAULT = 7  # dated backups kept in a directory (`backup --keep N`)


def resolve_target(target: str | Path, *, suffix: str = ".db", force: bool = False) -> Path:
    """Where a backup goes. A directory (existing, or written with a trailing slash; created
    0700 if missing) gets a new dated file, never replacing one; a file path must not exist
    unless ``force`` and its directory must."""
    text = str(target)
    path = Path(text)
    if path.is_dir() or text.endswith("/"):
        try:
            private_dir(path)
        except OSError as exc:
            raise StorageError(
                f"cannot create the backup directory {path} ({exc.strerror}). Fix: create it "
                f"as a user who may (sudo install -d -m 700 -o meshsage {path}), or pick another."
            ) from None
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time()))
        # Two backups in one second: both kept, the later one numbered after every file of
        # that second (even one pruned since, so "newest" by name stays true).
        taken = [n for s, n, _ in _dated(path, suffix) if s == stamp]
        n = max(taken, default=0) + 1
        return path / (f"meshsage-{stamp}{suffix}" if n == 1 else f"meshsage-{stamp}-{n}{suffix}")
    if path.exists() and not force:
        raise StorageError(
            f"{path} already exists; a backup never overwrites one silently. Fix: pass a "
            f"directory ({path.parent}/) for a new dated file, another name, or --force to "
            "replace it."
        )
    if not path.parent.is_dir():
        raise StorageError(
            f"the directory {path.parent} does not exist. Fix: create it, or end the path with "
            f"a slash ({path}/) to back up into a new directory."
        )
    return path


ORDER_FILE = ".meshsage-backups"  # the dated backups of a directory, in the order written


def written(path: Path) -> None:
    """Record the complete dated backup ``path`` as the newest of its directory."""
    order = _order(path.parent)
    names = [n for n in order if n != path.name] + [path.name]
    write_atomic(path.parent / ORDER_FILE, "".join(f"{n}\n" for n in names))


def newest_first(directory: Path, suffix: str = ".db") -> list[Path]:
    """The dated backups in ``directory``, newest first (the module docstring's order)."""
    rank = {name: i for i, name in enumerate(_order(directory))}
    dated = sorted(_dated(directory, suffix), key=lambda d: (rank.get(d[2].name, -1), d[0], d[1]))
    return [p for _, _, p in reversed(dated)]


def newest(directory: Path) -> Path | None:
    """The backup written last into ``directory`` that is still there (None: none recorded)."""
    for name in reversed(_order(directory)):
        if (directory / name).is_file():
            return directory / name
    return None


def prune(directory: Path, *, keep: int, suffix: str = ".db", keeping: Path) -> list[Path]:
    """Record ``keeping`` (the one just written) as the newest, then remove all but the newest
    ``keep`` dated backups in ``directory``; returns what went. Only files named as
    ``resolve_target`` names them are touched."""
    written(keeping)
    older = [p for p in newest_first(directory, suffix) if p != keeping]
    gone = older[max(0, keep - 1) :]
    for old in gone:
        old.unlink(missing_ok=True)
    if gone:
        left = {p.name for p in gone}
        names = [n for n in _order(directory) if n not in left]
        write_atomic(directory / ORDER_FILE, "".join(f"{n}\n" for n in names))
    return gone


def _order(directory: Path) -> list[str]:
    with contextlib.suppress(OSError):
        text = (directory / ORDER_FILE).read_text(encoding="utf-8")
        return [line for line in text.splitlines() if line and "/" not in line]
    return []


def _dated(directory: Path, suffix: str) -> list[tuple[str, int, Path]]:
    """(stamp, counter, path) of every dated backup in ``directory``; counter 1 = no suffix."""
    pattern = re.compile(r"meshsage-(\d{8}-\d{6})(?:-(\d+))?" + re.escape(suffix))
    found = []
    for p in directory.iterdir():
        m = pattern.fullmatch(p.name)
        if m is not None and p.is_file():
            found.append((m.group(1), int(m.group(2) or 1), p))
    return found


def backup(
    database: Path, target: str | Path, *, force: bool = False, keep: int | None = None
) -> BackupReport:
    """Copy ``database`` with the online backup API; safe while the bot runs. Into a
    directory, the newest ``keep`` dated backups stay (after this one is complete)."""
    if not database.is_file():
        raise StorageError(missing_database(database))
    into_dir = Path(target).is_dir() or str(target).endswith("/")
    target = resolve_target(target, force=force)
    tmp = target.with_name(f".{target.name}.partial")
    try:
        tmp.unlink(missing_ok=True)
        private_file(tmp)
        src = sqlite3.connect(database, timeout=30)  # read-write: WAL readers need the -shm
        try:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)  # one step: a consistent snapshot of committed data
                dst.execute("PRAGMA journal_mode = DELETE")
                _require_intact(dst, tmp)
                messages = int(dst.execute("SELECT count(*) FROM messages").fetchone()[0])
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(tmp, target)
    except (sqlite3.Error, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise _write_failed(target, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if into_dir and keep is not None:
        prune(target.parent, keep=keep, keeping=target)
    elif into_dir:
        written(target)
    return BackupReport(path=target, bytes=target.stat().st_size, messages=messages)


def missing_database(database: Path) -> str:
    """Why there is nothing to back up, and the fix that applies here."""
    if database.parent.is_dir():  # the state dir exists: the bot has not started in it yet
        return (
            f"no database at {database} yet: the bot creates it at its first start. Fix: start "
            "the bot (sudo systemctl start meshsage); if it runs with another state dir, pass "
            "its --config (or MESHSAGE_STATE_DIR)."
        )
    return (
        f"no database at {database} (the directory {database.parent} does not exist either). "
        "Fix: pass the bot's --config (or set MESHSAGE_STATE_DIR) so it points at its state dir."
    )


def _write_failed(target: Path, exc: BaseException) -> StorageError:
    text = str(exc)
    if getattr(exc, "errno", None) == errno.ENOSPC or "disk is full" in text:
        return DiskFull(
            f"no space left for the backup in {target.parent}; nothing was replaced and the "
            "earlier backups are kept. Fix: free space there (or keep fewer: --keep N), or "
            "back up to another disk."
        )
    if isinstance(exc, PermissionError):
        return StorageError(
            f"cannot write {target} (permission denied). Fix: run as the bot's user (sudo -u "
            "meshsage meshsage backup ...) or pick a directory this user can write."
        )
    return StorageError(
        f"backup to {target} failed ({getattr(exc, 'strerror', None) or text}). Fix: check "
        "free space and that the target directory is writable."
    )


def restore(source: Path, database: Path) -> tuple[BackupReport, Path | None]:
    """Replace ``database`` with the backup ``source``; returns the report and where the old
    database was saved (None when there was none)."""
    if not source.is_file():
        raise StorageError(f"{source}: no such backup file. Fix: pass the file `backup` wrote.")
    with RunLock(database.parent):
        try:
            check = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
            try:
                _require_intact(check, source)
                tables = {r[0] for r in check.execute("SELECT name FROM sqlite_master")}
                if not {"messages", "schema_migrations"} <= tables:
                    raise StorageError(
                        f"{source} is an SQLite file but not a meshsage database. Fix: pass a "
                        "file written by `meshsage backup`."
                    )
            finally:
                check.close()
        except sqlite3.DatabaseError as exc:
            raise StorageError(
                f"{source} is not a usable backup ({exc}). Fix: pick another backup file."
            ) from None
        saved = None
        if database.exists():
            saved = database.with_name(
                f"{database.name}.before-restore-{time.strftime('%Y%m%d-%H%M%S')}"
            )
            backup(database, saved, force=True)
        incoming = database.with_name(f".{database.name}.restoring")
        report = backup(source, incoming, force=True)
        for suffix in ("-wal", "-shm"):
            database.with_name(database.name + suffix).unlink(missing_ok=True)
        os.replace(incoming, database)
        _same_owner_as_dir(database)
        if saved is not None:
            _same_owner_as_dir(saved)
        return BackupReport(database, report.bytes, report.messages), saved


def _same_owner_as_dir(path: Path) -> None:
    """A restore run as root must leave files the service user (the state dir's owner) can
    write, or the bot could not open its own database."""
    if os.geteuid() == 0:
        st = path.parent.stat()
        os.chown(path, st.st_uid, st.st_gid)


def _require_intact(db: sqlite3.Connection, path: Path) -> None:
    rows = [r[0] for r in db.execute("PRAGMA integrity_check(5)")]
    if rows != ["ok"]:
        raise StorageError(
            f"{path} failed SQLite's integrity check ({'; '.join(rows)}). Fix: use another "
            "backup; to salvage this one, try `sqlite3 FILE .recover`."
        )
