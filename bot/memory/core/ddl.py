"""Schema changes written once for both backends: the migrations whose tables and columns mean
the same on SQLite and PostgreSQL, with each backend's names for the column types.

Invariants:
- ``SQLITE`` gives the text SQLite's migrations always had, to the character (SQLite keeps a
  table's CREATE text in ``sqlite_master``); ``POSTGRES`` gives the same tables, columns,
  constraints and indexes as PostgreSQL's did. So an applied migration is never changed in
  effect, whichever text a database was created with.
- A migration that needs what only one backend has (FTS5 and its triggers, the PostgreSQL
  word table, ``heard``, the outbox's ``gateway``) stays in that backend's schema module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Types:
    id: str  # a 64-bit row id (a key, or a reference to one)
    serial: str  # an auto-numbered 64-bit primary key
    real: str  # a time or other float


SQLITE = Types(id="INTEGER", serial="INTEGER PRIMARY KEY AUTOINCREMENT", real="REAL")
POSTGRES = Types(id="BIGINT", serial="BIGSERIAL PRIMARY KEY", real="DOUBLE PRECISION")


def outbox_claims(t: Types) -> str:
    # Claims (bot.memory.outbox_claims): who is sending a row right now, since when; a row is
    # sent only by its claimer. Planned packet ids: chosen and stored before a part is written,
    # so a re-send carries the same id and the receiving radio drops the repeat.
    return f"""
        ALTER TABLE outbox ADD COLUMN claimed_by TEXT;
        ALTER TABLE outbox ADD COLUMN claimed_at {t.real};
        CREATE TABLE outbox_packets (
            outbox_id {t.id} NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
            part INTEGER NOT NULL CHECK (part >= 0),
            packet_id {t.id} NOT NULL CHECK (packet_id > 0),
            PRIMARY KEY (outbox_id, part)
        );
        """


def memory_promises(t: Types) -> str:
    # Link codes live in the store (hashed, expiring, single use) so every gateway and a
    # restart honour them; failed redemptions are counted per code space (bot.memory.links).
    # A pending question's claim (claimed_by/claimed_at) lets one gateway take it over by
    # compare-and-set; finished outbox rows are pruned by age (bot.memory.keep).
    return f"""
        CREATE TABLE link_codes (
            code_hash TEXT PRIMARY KEY,
            transport TEXT NOT NULL,
            person TEXT NOT NULL,
            expires_at {t.real} NOT NULL
        );
        CREATE INDEX link_codes_person ON link_codes (transport, person);
        CREATE TABLE link_failures (
            id {t.serial},
            transport TEXT NOT NULL,
            person TEXT NOT NULL,
            at {t.real} NOT NULL
        );
        CREATE INDEX link_failures_at ON link_failures (at);
        ALTER TABLE messages ADD COLUMN claimed_by TEXT;
        ALTER TABLE messages ADD COLUMN claimed_at {t.real};
        CREATE INDEX outbox_finished ON outbox (updated_at) WHERE state != 'pending';
        """
