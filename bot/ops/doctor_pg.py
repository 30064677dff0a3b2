"""``doctor``'s look at a PostgreSQL store: asyncpg, reachable, login, server version,
migrations, the role's rights, and the database's size and free space where it can tell.

Invariants:
- Only looks: one connection, read-only queries (no migration, no table created), closed at
  the end. The password comes from ``storage.password_env`` and is never shown; the URL is
  shown without it.
- One cause, one failure: when the server cannot be reached or refuses the login, the checks
  that need a connection say "skipped".
- A role that cannot create tables is a failure only when the schema still has to be created
  or migrated (the bot's first start needs it), and the message names the GRANT to run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bot.config import StorageConfig
from bot.ops.doctor import MIN_FREE_BYTES, WARN_FREE_BYTES, Check, Level
from bot.ops.preflight import installed
from bot.urls import redact

CONNECT_TIMEOUT = 10.0
MIN_SERVER_VERSION = 13  # older servers are untested (the suite runs on 15)


async def check_postgres(storage: StorageConfig, *, env: Mapping[str, str]) -> list[Check]:
    assert storage.url is not None
    shown = redact(storage.url)
    if not installed("asyncpg"):
        return [
            Check("postgresql", Level.FAIL, "asyncpg is not installed",
                  "pip install 'meshsage[postgres]' (install.sh: --postgres)"),
        ]  # fmt: skip
    import asyncpg

    password = None
    if storage.password_env is not None:
        password = env.get(storage.password_env)
        if password is None:
            return [
                Check("postgresql", Level.FAIL, f"{storage.password_env} is not set",
                      f"set it (systemd: /etc/meshsage/env, `{storage.password_env}=...`)"),
            ]  # fmt: skip
    try:
        con = await asyncpg.connect(dsn=storage.url, password=password, timeout=CONNECT_TIMEOUT)
    except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as exc:
        return [
            Check("postgresql", Level.FAIL, f"{shown} refused the login ({_one_line(exc)})",
                  "check the user in storage.url and the password in "
                  f"{storage.password_env or 'storage.password_env (none is set)'}"),
            Check("postgresql schema", Level.SKIP, "not logged in"),
        ]  # fmt: skip
    except asyncpg.InvalidCatalogNameError as exc:
        return [
            Check("postgresql", Level.FAIL, f"{shown}: {_one_line(exc)}",
                  "create the database (docs/postgresql.md: CREATE DATABASE ... OWNER ...)"),
            Check("postgresql schema", Level.SKIP, "no database"),
        ]  # fmt: skip
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return [
            Check("postgresql", Level.FAIL, f"cannot reach {shown} ({_one_line(exc)})",
                  "check that the server runs and that host and port in storage.url are right"),
            Check("postgresql schema", Level.SKIP, "server unreachable"),
        ]  # fmt: skip
    try:
        return await _inspect(con, shown)
    finally:
        await con.close()


async def _inspect(con: Any, shown: str) -> list[Check]:
    from bot.memory.postgres.schema import MIGRATIONS

    version_num = int(await con.fetchval("SHOW server_version_num"))
    version = str(await con.fetchval("SHOW server_version")).split()[0]
    user, database = await con.fetchrow("SELECT current_user, current_database()")
    size = int(await con.fetchval("SELECT pg_database_size(current_database())"))
    out: list[Check] = []
    if version_num // 10000 < MIN_SERVER_VERSION:
        out.append(Check("postgresql", Level.FAIL, f"{shown}: server {version} is too old",
                         f"use PostgreSQL {MIN_SERVER_VERSION} or newer"))  # fmt: skip
    else:
        out.append(Check("postgresql", Level.OK,
                         f"{shown}: PostgreSQL {version}, logged in as {user}, "
                         f"database {size / 1e6:.1f} MB"))  # fmt: skip
    has_table = await con.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    done: set[str] = set()
    if has_table:
        done = {r[0] for r in await con.fetch("SELECT name FROM schema_migrations")}
    known = [name for name, _ in MIGRATIONS]
    newer = sorted(done - set(known))
    pending = [n for n in known if n not in done]
    can_create = bool(await con.fetchval("SELECT has_schema_privilege(current_schema(), 'CREATE')"))
    schema = await con.fetchval("SELECT current_schema()")
    grant = f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {user}; (as the database owner)"
    if newer:
        out.append(Check("postgresql schema", Level.FAIL,
                         f"migrated by a newer meshsage ({', '.join(newer)})",
                         "run that version, or restore a backup made for this one"))  # fmt: skip
    elif pending and not can_create:
        what = "created" if not done else f"migrated ({', '.join(pending)})"
        out.append(Check("postgresql schema", Level.FAIL,
                         f"the schema must be {what} at first start, but role {user} may not "
                         f"create tables in schema {schema}", grant))  # fmt: skip
    elif not done:
        out.append(Check("postgresql schema", Level.OK,
                         f"database {database} is empty; the first start creates the "
                         "tables"))  # fmt: skip
    elif pending:
        out.append(Check("postgresql schema", Level.WARN,
                         f"migrations pending: {', '.join(pending)}",
                         "none needed: the next start migrates (back up first: "
                         "meshsage backup /var/lib/meshsage/backups/)"))  # fmt: skip
    else:
        rights = await con.fetchval(
            "SELECT has_table_privilege('messages', 'SELECT, INSERT, UPDATE, DELETE')"
        )
        if not rights:
            out.append(Check("postgresql schema", Level.FAIL,
                             f"role {user} may not read and write the messages table",
                             f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                             f"{schema} TO {user};"))  # fmt: skip
        else:
            out.append(Check("postgresql schema", Level.OK,
                             f"schema up to date ({len(known)} migrations)"))  # fmt: skip
    out.append(await _free_space(con))
    return out


async def _free_space(con: Any) -> Check:
    """The server's data directory, when this role may see it and it is on this machine."""
    try:
        data_dir = str(await con.fetchval("SHOW data_directory"))
    except Exception:  # a plain role may not read it: the server's disk is not visible
        return Check("postgresql disk", Level.SKIP,
                     "free space on the server's disk is not visible to this role")  # fmt: skip
    return _disk(data_dir)


def _disk(data_dir: str) -> Check:
    path = Path(data_dir)
    if not path.is_absolute() or not os.path.isdir(path):
        return Check("postgresql disk", Level.SKIP,
                     f"the server's data directory ({data_dir}) is on another machine")  # fmt: skip
    free = shutil.disk_usage(path).free
    shown = f"{free / 1e9:.1f} GB free on the server's data directory ({data_dir})"
    if free < MIN_FREE_BYTES:
        return Check("postgresql disk", Level.FAIL, shown, "free space on the database server")
    if free < WARN_FREE_BYTES:
        return Check("postgresql disk", Level.WARN, shown, "free some space soon")
    return Check("postgresql disk", Level.OK, shown)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
