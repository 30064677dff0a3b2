"""Outbox claims and planned packet ids: the backend-neutral half (SQL lives with each store).

Invariants (every store keeps them; tests/test_store_contract.py checks both backends):
- A row is sent only by the process holding its claim. ``claim_delivery`` is a
  compare-and-set in the store (``pending`` and unclaimed -> claimed by this process, in one
  statement), so of two rounds, processes or gateways asking for the same row exactly one
  gets it; the loser gets None and sends nothing. The winner gets the row as it stands after
  the claim (its recorded parts are current, never an older snapshot).
- ``queue_delivery(..., claim=True)`` creates the row already claimed by this process: the
  answer a turn has just made (or is streaming) is never listed by ``undelivered``, which
  returns only unclaimed ``pending`` rows.
- A claim ends with the row (``finish_delivery``) or is given back (``release_delivery``, a
  reply that waits for its link). A claim whose owner died (kill -9, power loss) is released
  when a process of the same gateway starts (``release_stale_claims``): the owner token starts
  with the gateway's name, and one gateway name is one running process at a time.
- ``plan_part`` stores the packet id chosen for a part *before* the part is written; the first
  id stored for a part wins and is returned, so every later send of that part (an ACK retry,
  a re-send after a crash) carries the same id and a receiving radio that already has it drops
  the repeat.
"""

from __future__ import annotations

import os
import secrets

SQLITE_GATEWAY = "local"  # one process owns a SQLite file: one gateway


def new_owner(gateway: str) -> str:
    """A claim owner token for one opened store: ``<gateway>/<pid>/<random>``."""
    return f"{gateway}/{os.getpid()}/{secrets.token_hex(4)}"


def owner_prefix(gateway: str) -> str:
    """What every owner token of ``gateway`` starts with (stale claims are found by it)."""
    return f"{gateway}/"
