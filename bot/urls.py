"""Store URLs as messages and logs may show them: never with a password.

Invariant: ``redact`` removes the password of ``user:password@`` and every ``password=`` query
parameter, and changes nothing else; the one function every floor uses (memory's errors, the
operations' doctor, status, backup and run log).
"""

from __future__ import annotations


def redact(url: str) -> str:
    """``url`` without any password (the config refuses one, but a URL from the command line
    or an older file might carry it)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, tail = rest.partition("/")
    creds, at, where = host.rpartition("@")
    if at and ":" in creds:
        host = f"{creds.split(':', 1)[0]}:***@{where}"
    path, q, query = tail.partition("?")
    kept = [kv for kv in query.split("&") if kv and not kv.lower().startswith("password=")]
    return f"{scheme}://{host}{slash}{path}{q if kept else ''}{'&'.join(kept)}"


def user_of(url: str) -> str | None:
    """The user name a ``postgresql://user[:password]@host/db`` URL names, if any."""
    _, sep, rest = url.partition("://")
    creds, at, _ = rest.partition("/")[0].rpartition("@")
    name = creds.split(":", 1)[0] if sep and at else ""
    return name or None
