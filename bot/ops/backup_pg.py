"""Backups and restores of a PostgreSQL store with the server's own tools, pg_dump and
pg_restore (the custom format: compressed, consistent, restorable table by table).

Invariants:
- The password comes from the variable ``storage.password_env`` names, handed to the tool as
  ``PGPASSWORD`` in its environment; it never appears on a command line, in a message or a log.
- When a tool is missing, the error says exactly what to run instead (the same command with
  the URL, and how to install the client tools); nothing is half done.
- A dump is written to a hidden ``.partial`` file, checked with ``pg_restore --list``, then
  renamed into place; into a directory, old dumps are pruned only after the new one is
  complete (the same rules as the SQLite backup).
- A restore runs in one transaction (``--single-transaction``): it applies completely or not at
  all. It refuses while this gateway runs; other gateways sharing the database must be stopped
  by the operator (the message says so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from bot.errors import StorageError
from bot.files import private_file
from bot.ops.backup import (
    BackupReport,
    RunLock,
    _write_failed,
    prune,
    resolve_target,
    written,
)
from bot.urls import redact

SUFFIX = ".dump"
INSTALL_HINT = "sudo apt install postgresql-client (the version of your server or newer)"


def _tool(name: str, instead: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise StorageError(
            f"{name} is not installed, and a PostgreSQL store is backed up with it. Fix: "
            f"{INSTALL_HINT}, then run this again; or run it yourself: {instead}"
        )
    return found


def _env(password_env: str | None, env: Mapping[str, str]) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if password_env is not None and env.get(password_env) is not None:
        out["PGPASSWORD"] = env[password_env]
    return out


def _run(argv: list[str], env: dict[str, str], what: str) -> str:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise StorageError(f"{what} could not run ({exc.strerror}).") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise StorageError(f"{what} failed: {last}")
    return done.stdout


def dump(
    url: str,
    target: str | Path,
    *,
    password_env: str | None,
    env: Mapping[str, str],
    force: bool = False,
    keep: int | None = None,
) -> BackupReport:
    """``pg_dump --format=custom`` of the store into ``target`` (a file or a directory)."""
    into_dir = Path(target).is_dir() or str(target).endswith("/")
    shown = redact(url)
    pg_dump = _tool(
        "pg_dump",
        f"PGPASSWORD=... pg_dump --format=custom --no-owner --file=meshsage.dump '{shown}'",
    )
    path = resolve_target(target, suffix=SUFFIX, force=force)
    tmp = path.with_name(f".{path.name}.partial")
    child = _env(password_env, env)
    try:
        tmp.unlink(missing_ok=True)
        private_file(tmp)
        _run(
            [pg_dump, "--format=custom", "--no-owner", f"--file={tmp}", f"--dbname={url}"],
            child,
            f"pg_dump of {shown}",
        )
        listing = _run([_tool("pg_restore", "pg_restore --list FILE"), "--list", str(tmp)],
                       child, f"checking the dump of {shown}")  # fmt: skip
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_failed(path, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if "TABLE DATA" not in listing or " messages " not in listing:
        path.unlink(missing_ok=True)
        raise StorageError(
            f"the dump of {shown} holds no meshsage tables (messages). Fix: check storage.url "
            "names the bot's database."
        )
    if into_dir and keep is not None:
        prune(path.parent, keep=keep, suffix=SUFFIX, keeping=path)
    elif into_dir:
        written(path)
    return BackupReport(path=path, bytes=path.stat().st_size, messages=-1)


def restore_dump(
    source: Path, url: str, *, password_env: str | None, env: Mapping[str, str], state_dir: Path
) -> None:
    """``pg_restore --clean --single-transaction`` of ``source`` into the store."""
    shown = redact(url)
    if not source.is_file():
        raise StorageError(f"{source}: no such backup file. Fix: pass the file `backup` wrote.")
    pg_restore = _tool(
        "pg_restore",
        "PGPASSWORD=... pg_restore --clean --if-exists --no-owner --single-transaction "
        f"--dbname='{shown}' {source}",
    )
    child = _env(password_env, env)
    try:
        listing = _run([pg_restore, "--list", str(source)], child, f"reading {source}")
    except StorageError:
        raise StorageError(
            f"{source} is not a pg_dump custom-format file. Fix: pass a file written by "
            "`meshsage backup` for this PostgreSQL store."
        ) from None
    if " messages " not in listing:
        raise StorageError(
            f"{source} is a dump, but not of a meshsage database. Fix: pick another file."
        )
    with RunLock(state_dir):
        _run(
            [pg_restore, "--clean", "--if-exists", "--no-owner", "--single-transaction",
             f"--dbname={url}", str(source)],
            child,
            f"pg_restore into {shown} (nothing was changed)",
        )  # fmt: skip
