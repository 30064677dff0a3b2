"""The schema-version rule both backends' migrations share: never open a newer database.

Invariant: a store whose ``schema_migrations`` records a migration this version does not know
was written by a newer meshsage; opening it would run old code over a schema it does not
understand (and a later downgrade-then-upgrade could skip work). ``refuse_newer`` raises before
anything is changed, naming the unknown migrations and how to proceed.
"""

from __future__ import annotations

from collections.abc import Iterable

from bot.errors import StorageError


def refuse_newer(done: Iterable[str], known: Iterable[str], where: str) -> None:
    unknown = sorted(set(done) - set(known))
    if unknown:
        raise StorageError(
            f"{where} was written by a newer meshsage (migrations this version does not know: "
            f"{', '.join(unknown)}). Fix: run the newer meshsage version, or restore a backup "
            "taken before the upgrade; this version changes nothing in it."
        )
