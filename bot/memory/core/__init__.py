"""The memory store's table families written once for SQLite and PostgreSQL (see ``db``)."""
