"""The operator commands behind ``meshsage status | backup | restore``, for SQLite and
PostgreSQL stores alike (the CLI parses, these act).

Invariants:
- Output names the store without a password; errors are ``MeshsageError`` with the fix (the
  CLI prints one line, never a traceback).
- ``backup`` into a directory keeps the newest ``--keep`` dated files; to a file it never
  overwrites without ``--force`` (bot.ops.backup).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from bot.config import Config
from bot.ops import status as status_file


def status(config: Config, *, as_json: bool, env: Mapping[str, str]) -> int:
    path = status_file.find(config.database_path.parent, env)
    try:
        report = status_file.read(path)
    except FileNotFoundError:
        print(
            f"meshsage: no status file at {path}: the bot is not running (or runs with another "
            "state dir). Fix: start it (sudo systemctl start meshsage) or pass its --config.",
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError) as exc:
        print(f"meshsage: cannot read {path} ({exc})", file=sys.stderr)
        return 1
    lines, ok = status_file.render(report, running=status_file.pid_running(report.pid))
    print(report.to_json() if as_json else "\n".join(lines))
    return 0 if ok else 1


def backup(
    config: Config,
    target: str,
    *,
    env: Mapping[str, str],
    keep: int,
    force: bool,
    missing_ok: bool = False,
) -> int:
    if missing_ok and not config.storage.postgres and not config.database_path.is_file():
        from bot.ops.backup import missing_database

        print(f"backup: nothing to back up; {missing_database(config.database_path)}")
        return 0
    if config.storage.postgres:
        from bot.ops.backup_pg import dump

        assert config.storage.url is not None
        report = dump(config.storage.url, target, password_env=config.storage.password_env,
                      env=env, force=force, keep=keep)  # fmt: skip
        print(f"backup: {report.path} ({report.bytes / 1e6:.1f} MB, pg_dump custom format)")
        return 0
    from bot.ops.backup import backup as copy

    report = copy(config.database_path, target, force=force, keep=keep)
    print(
        f"backup: {report.path} ({report.bytes / 1e6:.1f} MB, {report.messages} messages, "
        "integrity ok)"
    )
    return 0


def restore(config: Config, source: Path, *, env: Mapping[str, str]) -> int:
    if config.storage.postgres:
        from bot.ops.backup_pg import restore_dump
        from bot.urls import redact

        assert config.storage.url is not None
        restore_dump(source, config.storage.url, password_env=config.storage.password_env,
                     env=env, state_dir=config.database_path.parent)  # fmt: skip
        print(
            f"restore: {redact(config.storage.url)} now holds the data of {source} (stop every "
            "other gateway sharing it before a restore)"
        )
        return 0
    from bot.ops.backup import restore as replace

    report, saved = replace(source, config.database_path)
    print(f"restore: {report.path} now holds {report.messages} messages from {source}")
    if saved is not None:
        print(f"restore: the previous database was saved as {saved}")
    return 0
