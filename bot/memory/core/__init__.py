"""The memory store's table families written once for SQLite and PostgreSQL.

Design (issue 19 point 1, "one core, two dialects"):

- Each family (``messages``, ``sessions``, ``derived``, ``identity``, ``portable``,
  ``upkeep``, ``outbox``, ``search``) is a mixin over ``db.CoreBase``: four query calls
  (``_all``, ``_one``, ``_val``, ``_exec``) and one transaction (``_atomic()``, yielding a
  ``db.Tx`` with the same calls on one connection). The decisions (session rules, chapter
  replacement, link moves, what ``!forget`` deletes and in which order, batch pruning,
  import refusals, outbox states and claims, the heard check, reply parents) live here once;
  the backends' ``SqliteStore`` and ``PostgresStore`` list these mixins next to their own.
- SQL is written once with ``?`` placeholders. PostgreSQL rewrites a string to ``$1, $2, ...``
  the first time it sees it and memoises the result (``db.numbered``), so a query costs one
  dict lookup more there and nothing more on SQLite: no extra await, no extra thread hop.
- ``db.Dialect`` holds only the fragments that differ: row locks (``FOR UPDATE``, nothing on
  SQLite, which serialises writers on ``BEGIN IMMEDIATE``), ``SKIP LOCKED`` in batch deletes,
  the id-list form (``= ANY(?::bigint[])`` vs ``IN (?, ?, ...)``), JSON array expansion, the
  re-keying of a moved message's search words, the outbox's gateway column, the heard-before
  check of an arriving message. What both engines accept is written once (``RETURNING``,
  ``INSERT ... ON CONFLICT``, ``INSERT ... SELECT ... WHERE``, ``WITH``, ``coalesce``).
- Hooks (``CoreBase``) for what a backend derives or does on its own: ``_search_column`` (a
  message's search words written in its INSERT: nothing on SQLite, whose FTS triggers index
  it), ``_term_matches`` (the full-text lookup itself), ``_claim_gateway``, ``_after_import``,
  ``_mark_erase``/``_erase``.
- What truly differs stays in the backend packages: connection, pool and locks (``base``),
  migrations that use one backend's features (``ddl`` holds those that mean the same on
  both), full-text search, the erase after ``!forget`` (FTS rewrite + WAL truncation vs
  ``VACUUM``), the rows a copy derives (``postgres.rows``: search words, sequences),
  vector storage and cache invalidation.
- Round trips: a write that is one statement runs as one (``_exec``/``_val``: autocommit, no
  BEGIN/COMMIT), so a message a turn stores is one round trip on PostgreSQL, one thread hop
  on SQLite (``messages.add_message``).
- Why not SQLAlchemy Core: a PostgreSQL turn costs round trips, which hand-written SQL already
  minimises; SQLAlchemy would add per-statement Python work (cache keys, compiled-cache
  lookups, result processing) and, on aiosqlite, a greenlet switch per call, on a SQLite turn
  of a few milliseconds and ~25 statements. This layer is ~200 lines and adds nothing per
  query on SQLite (``bench/store_core.py`` measures it).
"""
