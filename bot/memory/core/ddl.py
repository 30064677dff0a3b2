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

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial


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


def recall_notes(t: Types) -> str:
    # The recall note sent with a person's message (bot.memory.context) is kept with it, so a
    # restart shows the same prompt; deleted with its message (!forget, retention).
    return "ALTER TABLE messages ADD COLUMN recall_note TEXT;"


def incognito_notes_facts(t: Types) -> str:
    # An incognito stretch has an id (``incognito_stretch``, NULL when incognito is off): every
    # gateway holding the stretch's turns in memory drops them once the id changed (!incognito,
    # !reset, !forget; bot.memory.stretch). A recall note records the ids of the messages it
    # quotes (``recall_ids``, JSON list) so pruning one drops the note. Fact extraction keeps a
    # high-water mark (``facts_through``): each message is read for facts once; existing
    # conversations start after their newest summarized session (extracted at its close).
    return f"""
        ALTER TABLE conversations ADD COLUMN incognito_stretch TEXT;
        ALTER TABLE conversations ADD COLUMN facts_through {t.id} NOT NULL DEFAULT 0;
        ALTER TABLE messages ADD COLUMN recall_ids TEXT;
        UPDATE conversations SET facts_through = coalesce((SELECT max(s.last_message_id)
            FROM sessions s WHERE s.conversation_id = conversations.id
            AND s.summary IS NOT NULL), 0);
        """


def shown_parts(t: Types) -> str:
    # The Discord messages a streamed answer put on screen, recorded as they are posted and
    # keyed by the question (the answer's outbox row does not exist yet while it streams): after
    # a restart the answer edits them instead of posting a second copy (bot.delivery). Deleted
    # with the question (!forget, retention); cleared when the answer's row is finished.
    return f"""
        CREATE TABLE shown_parts (
            question_id {t.id} NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
            part INTEGER NOT NULL CHECK (part >= 0),
            platform_id TEXT NOT NULL,
            PRIMARY KEY (question_id, part)
        );
        """


Migration = tuple[str, Callable[[], str]]


def _named(t: Types, *steps: tuple[str, Callable[[Types], str]]) -> list[Migration]:
    return [(name, partial(step, t)) for name, step in steps]


def notes_and_claims(t: Types) -> list[Migration]:
    """Migrations 006-008, the same on both backends (each backend's list places them)."""
    return _named(
        t,
        ("006_recall_notes", recall_notes),
        ("007_outbox_claims", outbox_claims),
        ("008_memory_promises", memory_promises),
    )


def stretches_and_shown(t: Types) -> list[Migration]:
    """Migrations 010-011, the same on both backends."""
    return _named(
        t,
        ("010_incognito_notes_facts", incognito_notes_facts),
        ("011_shown_parts", shown_parts),
    )


def facts_pending(t: Types) -> str:
    # A message moved below a conversation's ``facts_through`` mark without having been read
    # for facts (a !link joins the other account's unread messages into a home whose mark is
    # past them) is flagged, so fact extraction reads it once (bot.memory.facts).
    return """
        ALTER TABLE messages ADD COLUMN facts_pending INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX messages_facts_pending ON messages (conversation_id, id)
            WHERE facts_pending = 1;
        """


def link_facts(t: Types) -> list[Migration]:
    """Migration 014, the same on both backends."""
    return _named(t, ("014_facts_pending", facts_pending))


def held_commands(t: Types) -> str:
    # A command is stored before it runs and removed once its reply is in the outbox (or
    # sent), so one lost to a kill is run again, or its person told, at the gateway's next
    # start (bot.responder). ``gateway``: the claim gateway that heard it.
    return f"""
        CREATE TABLE held_commands (
            id {t.serial},
            gateway TEXT NOT NULL,
            transport TEXT NOT NULL,
            person TEXT NOT NULL,
            space TEXT NOT NULL,
            text TEXT NOT NULL,
            platform_id TEXT,
            author TEXT,
            created_at {t.real} NOT NULL
        );
        CREATE INDEX held_commands_gateway ON held_commands (gateway, id);
        """


def commands_held(t: Types) -> list[Migration]:
    """Migration 017, the same on both backends."""
    return _named(t, ("017_held_commands", held_commands))


def command_marks(t: Types) -> str:
    # ``done_at``: the command's effect committed (written in the effect's own transaction),
    # so a replay after a kill tells instead of running it again. ``released_at``: its reply
    # was queued; the row stays, without its text, as a tombstone that Discord catch-up checks
    # (``known_platform_ids``), so a command read back from history never runs twice. Pruned
    # with the outbox once older than the longest catch-up window (bot.memory.keep).
    return f"""
        ALTER TABLE held_commands ADD COLUMN done_at {t.real};
        ALTER TABLE held_commands ADD COLUMN released_at {t.real};
        CREATE INDEX held_commands_platform ON held_commands (transport, platform_id);
        """


def commands_marked(t: Types) -> list[Migration]:
    """Migration 021, the same on both backends."""
    return _named(t, ("021_command_marks", command_marks))


def mesh_pins(t: Types) -> str:
    # Trust on first use (bot.transports.mesh_keys): the public key a node's first PKI DM came
    # with, base64; a later DM for that id with another key, or none, is not that person.
    # Deleted by !forget, replaced only by the operator (`meshsage pins --repin`, !repin).
    # ``authenticated``: whether a held command's sender was (bot.trust), so a replay after a
    # kill is judged as the command was; rows from before default to not authenticated.
    return f"""
        CREATE TABLE key_pins (
            transport TEXT NOT NULL,
            person TEXT NOT NULL,
            public_key TEXT NOT NULL,
            pinned_at {t.real} NOT NULL,
            PRIMARY KEY (transport, person)
        );
        ALTER TABLE held_commands ADD COLUMN authenticated INTEGER NOT NULL DEFAULT 0;
        """


def pins(t: Types) -> list[Migration]:
    """Migration 022, the same on both backends."""
    return _named(t, ("022_mesh_pins", mesh_pins))


def fact_history(t: Types) -> str:
    # A fact's earlier values, newest last (JSON list of {"text", "until", "pinned",
    # "source_ids"}): a new value for the same subject replaces the text and keeps the old one
    # here, so !facts can say what changed and from where (bot.memory.facts). Deleted with its
    # fact (!unremember, !forget).
    return "ALTER TABLE facts ADD COLUMN history TEXT NOT NULL DEFAULT '[]';"


def fact_changes(t: Types) -> list[Migration]:
    """Migration 018, the same on both backends."""
    return _named(t, ("018_fact_history", fact_history))


def chat_settings_table(t: Types) -> str:
    # The model and the persona (system prompt) chosen for a scope: a channel
    # ("discord:guild:1:ch:2"), a guild ("discord:guild:1"), a transport ("meshtastic") or the
    # whole bot ("*"); NULL: not set there (the wider scope, then the config, decides).
    return f"""
        CREATE TABLE chat_settings (
            scope TEXT PRIMARY KEY,
            model TEXT,
            persona TEXT,
            updated_at {t.real} NOT NULL
        );
        """


def chat_settings(t: Types) -> list[Migration]:
    """Migration 019, the same on both backends."""
    return _named(t, ("019_chat_settings", chat_settings_table))
