"""Doctor's identity check: the mesh's key pins and what the bot refused (issue 44).

Invariants:
- Read-only: the SQLite file is opened ``mode=ro`` (PostgreSQL: ``meshsage pins`` reads it);
  refusals come from the running bot's status file, when it is fresh.
- Shows counts and the operator's risks (``bot.identity.risks``), never a key or a message.
"""

from __future__ import annotations

import sqlite3
import time

from bot.config import Config
from bot.identity import risks
from bot.ops import status as status_file
from bot.ops.doctor import Check, Level


def check_identity(config: Config) -> Check:
    found = risks(config)
    parts = []
    if not config.storage.postgres and config.database_path.exists():
        try:
            db = sqlite3.connect(f"file:{config.database_path}?mode=ro", uri=True, timeout=10)
            try:
                n = int(db.execute("SELECT count(*) FROM key_pins").fetchone()[0])
            finally:
                db.close()
            parts.append(f"{n} node key(s) pinned (`meshsage pins` lists them)")
        except sqlite3.Error:  # not migrated yet (022): the next start creates the table
            parts.append("no key pins yet")
    path = config.database_path.parent / status_file.STATUS_FILE
    try:
        report = status_file.read(path)
    except (OSError, ValueError, TypeError):
        report = None
    if report is not None and time.time() - report.written_at < status_file.STALE_AFTER:
        refused = sum(report.identity.values())
        parts.append(f"{refused} DM(s) refused as not their node's since the bot started")
    mode = config.meshtastic.unauthenticated_dm if config.meshtastic else "chat"
    parts.append(f"DMs without PKI: {mode}")
    if found:
        return Check("identity", Level.WARN, "; ".join(parts) + ". " + " ".join(found))
    return Check("identity", Level.OK, "; ".join(parts))
