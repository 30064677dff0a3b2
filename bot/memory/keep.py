"""What the stores keep, and for how long: the backend-neutral decisions behind ``!forget``,
retention, forgetting by use and the claim of a pending question. The SQLite and PostgreSQL
adapters only run the SQL these decisions call for.

Invariants:
- A finished outbox row (delivered, sent, failed, expired) is kept ``OUTBOX_KEEP_SECONDS``
  after it finished (a reply to one of its parts is still resolved, ``!more`` still works),
  then retention and forgetting by use delete it with its parts. Pending rows are never
  pruned: delivery needs them.
- ``!forget`` on one side of a link also clears what the other side derived from this side's
  words: the other side's rolling summaries and long-term summary, its session summaries
  (rebuilt from what is left), the facts whose sources were this side's messages, and the
  other side's outbox rows (replies there may quote this side, e.g. a ``!history`` reply).
- A held command's reply once queued, the command's row keeps only its platform id and times
  (no text) for ``COMMAND_TOMBSTONE_SECONDS``: catch-up never runs it again from history.
- A pending question is taken over only by compare-and-set: its claim is empty, already
  ours, or older than ``CLAIM_STALE_SECONDS`` (its gateway is gone: a live gateway renews
  the claim when its turn starts). Every pending question is answered on its own, in order
  (never folded into a later one); a running gateway takes over the pending questions whose
  claim went stale (``pending_messages(stale_before=...)``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

OUTBOX_KEEP_SECONDS = 3600.0  # as HEARD_WINDOW_SECONDS: long enough for dedup and !more
CLAIM_STALE_SECONDS = 300.0  # longer than a turn (default read_timeout 120 s x 2 tries)
# A released held command stays (without its text) this long: Discord catch-up reads back at
# most ``catch_up.max_age`` (14 days at most), and must see that the command already ran.
COMMAND_TOMBSTONE_SECONDS = 14 * 86_400.0


def outbox_cutoff(now: float) -> float:
    """Finished outbox rows last touched before this are pruned."""
    return now - OUTBOX_KEEP_SECONDS


def facts_touching(facts: Iterable[tuple[int, str]], message_ids: set[int]) -> list[int]:
    """Ids of the facts (id, source_ids JSON) whose sources include one of ``message_ids``."""
    out = []
    for fact_id, sources in facts:
        try:
            ids = json.loads(sources or "[]")
        except ValueError:
            ids = []
        if isinstance(ids, list) and any(i in message_ids for i in ids if isinstance(i, int)):
            out.append(int(fact_id))
    return out
