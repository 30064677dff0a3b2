"""The schema-version rules both backends' migrations share: never open a newer database, and
never use an interrupted copy as a store.

Invariants:
- A store whose ``schema_migrations`` records a migration this version does not know was
  written by a newer meshsage; opening it would run old code over a schema it does not
  understand. ``check_versions`` raises before anything is changed, naming the unknown
  migrations and how to proceed.
- ``COPY_MARK`` in ``schema_migrations`` means ``meshsage migrate-store`` began copying into
  this store and has not verified the copy yet (``bot.memory.move``): only that command may
  open it (``copying=True``; it starts the copy over); anything else refuses it, so a half
  copy is never used as the memory.
"""

from __future__ import annotations

from collections.abc import Iterable

from bot.errors import StorageError

COPY_MARK = "~migrate-store copy not finished"


def check_versions(
    done: Iterable[str], known: Iterable[str], where: str, *, copying: bool = False
) -> None:
    done = set(done)
    unknown = sorted(done - set(known) - {COPY_MARK})
    if unknown:
        raise StorageError(
            f"{where} was written by a newer meshsage (migrations this version does not know: "
            f"{', '.join(unknown)}). Fix: run the newer meshsage version, or restore a backup "
            "taken before the upgrade; this version changes nothing in it."
        )
    if COPY_MARK in done and not copying:
        raise StorageError(
            f"{where} holds an unfinished `meshsage migrate-store` copy (interrupted before it "
            "was verified: some rows are missing). Fix: run the same migrate-store command "
            "again (it empties this destination and starts over), or point the config at the "
            "source store."
        )
