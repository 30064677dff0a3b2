"""The memory port, cut along its jobs: each consumer asks for the Protocol(s) it uses.

``SqliteStore`` (one process on a Pi) and ``PostgresStore`` (several gateways sharing one
memory) implement every one of them from the one core (``bot.memory.core``) and pass the same
contract suite (tests/test_store_contract*.py, each Protocol's tests on both backends).

What the bot remembers:
- ``ConversationLog`` (``port_log``): conversations and their messages, the raw log.
- ``Derived``, ``SessionLog`` (``port_derived``): summary chapters and facts; sessions and the
  long-term summary.
- ``Recall`` (``port_recall``): the term index, the outline, vectors, use counts, notes.
- ``Identities`` (``port_identity``): linked DMs, incognito, link codes, key pins.
- ``Upkeep``, ``Movable`` (``port_upkeep``): lifecycle, forget and prune, counts, one
  person's export/import; the whole-store copy of ``migrate-store``.
The durable work queue (``port_work``): ``Outbox`` (what must still reach someone),
``WorkQueue`` (pending questions, held commands), ``Claims`` (turn locks, one-off claims).
Settings (``port_settings``): ``Settings``, the per-chat settings.

Each Protocol module's docstring states the invariants its methods keep. One holds for all:
database failures surface as ``StorageError`` or ``sqlite3.Error`` (SQLite only).

``MemoryStore`` is the union: what app.py wires and what a backend must implement whole. A
class that needs several jobs declares its own union next to itself (``SummaryStore(
ConversationLog, Derived, Claims, Protocol)`` in bot.memory.summary) rather than taking
``MemoryStore``.

Adding a feature's store methods (reminders, named sessions, ...): write them in a new core
mixin listed by both backends (``SqliteStore``, ``PostgresStore``), declare them in a new
Protocol module next to this one (``port_<feature>.py``: its invariants in the docstring, at
most 40 methods), add its contract tests on both backends (the ``memory`` fixture), and add it
to ``MemoryStore``'s bases below (one line, and its import). tests/test_store_ports.py fails
until every public store method sits in exactly one Protocol and each is called by a test.
"""

from __future__ import annotations

from typing import Protocol

from bot.memory.port_derived import Derived, SessionLog
from bot.memory.port_identity import Identities
from bot.memory.port_log import ConversationLog
from bot.memory.port_recall import Recall
from bot.memory.port_settings import Settings
from bot.memory.port_upkeep import Movable, Upkeep
from bot.memory.port_work import Claims, Outbox, WorkQueue


class MemoryStore(
    ConversationLog,
    Derived,
    SessionLog,
    Recall,
    Identities,
    Upkeep,
    Movable,
    Outbox,
    WorkQueue,
    Claims,
    Settings,
    Protocol,
):
    """Every job of the store: what each backend implements (one line per Protocol above)."""
