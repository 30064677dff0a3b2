"""The store's port is cut along its jobs (bot.memory.port): each Protocol stays small, the
union covers every public method of both backends (a new method must be placed in one), both
backends implement each Protocol with the declared signatures, and every method of every
Protocol is exercised by the contract suite, which runs each test on SQLite and PostgreSQL
(the ``memory`` fixture)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, Protocol

import pytest

from bot.memory.port import MemoryStore
from bot.memory.postgres import PostgresStore
from bot.memory.sqlite import SqliteStore

MAX_METHODS = 40
BACKENDS = (SqliteStore, PostgresStore)
# Public names of a backend that belong to no Protocol, each with its reason.
BACKEND_ONLY = {
    "open": "each backend's constructor (a path, or a URL and a password)",
    "dialect": "the SQL fragments of the core (a class attribute, not a job)",
    "database_bytes": "PostgreSQL's server-side size; the monitor sizes a SQLite file itself",
    "finish_scrub": "SQLite's crash-safe erase, run when the store opens",
}
TESTS = Path(__file__).parent


def ports() -> list[type]:
    """The Protocols ``MemoryStore`` unites (its bases, in order)."""
    return [b for b in MemoryStore.__bases__ if b is not Protocol]


def members(proto: type) -> set[str]:
    """Public methods and properties a Protocol declares, its own and its bases'."""
    out: set[str] = set()
    for cls in proto.__mro__:
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        out |= {n for n, v in vars(cls).items() if not n.startswith("_") and _is_member(v)}
    return out


def _is_member(value: Any) -> bool:
    return inspect.isfunction(value) or isinstance(value, property)


def public_methods(store: type) -> set[str]:
    return {n for n in dir(store) if not n.startswith("_")} - set(BACKEND_ONLY)


def test_each_protocol_is_small_and_the_jobs_do_not_overlap() -> None:
    seen: dict[str, str] = {}
    assert len(ports()) >= 8
    for proto in ports():
        names = members(proto)
        assert 0 < len(names) <= MAX_METHODS, f"{proto.__name__}: {len(names)} methods"
        for name in names:
            assert name not in seen, f"{name} is in both {seen[name]} and {proto.__name__}"
            seen[name] = proto.__name__
    assert set(seen) == members(MemoryStore)


@pytest.mark.parametrize("store", BACKENDS, ids=lambda s: s.__name__)
def test_the_union_covers_every_public_store_method(store: type) -> None:
    missing = public_methods(store) - members(MemoryStore)
    assert not missing, (
        f"{store.__name__} has public methods no Protocol declares: {sorted(missing)}; place "
        "each in the Protocol of its job (bot/memory/port.py says how), or make it private"
    )
    unimplemented = members(MemoryStore) - public_methods(store)
    assert not unimplemented, f"{store.__name__} lacks {sorted(unimplemented)}"


def _both_are_memory_stores(sqlite: SqliteStore, postgres: PostgresStore) -> list[MemoryStore]:
    """mypy checks here that each backend implements every Protocol, types included."""
    return [sqlite, postgres]


def _shape(function: Any) -> list[tuple[str, Any, Any]]:
    params = list(inspect.signature(function).parameters.values())
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("store", BACKENDS, ids=lambda s: s.__name__)
def test_both_backends_take_the_arguments_each_protocol_declares(store: type) -> None:
    """Names, kinds and defaults (mypy checks the types where the stores are wired)."""
    for proto in ports():
        for name in members(proto):
            declared, actual = inspect.getattr_static(proto, name), getattr(store, name)
            if isinstance(declared, property):
                assert isinstance(inspect.getattr_static(store, name), property), name
                continue
            assert _shape(declared) == _shape(actual), f"{proto.__name__}.{name} on {store}"


def _contract_modules() -> list[Path]:
    """Test modules with a test that takes ``memory`` (run on every backend)."""
    out = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef)
            and node.name.startswith("test_")
            and any(a.arg == "memory" for a in node.args.args)
            for node in ast.walk(tree)
        ):
            out.append(path)
    return out


def test_every_protocol_method_is_exercised_on_both_backends() -> None:
    used: set[str] = set()
    modules = _contract_modules()
    assert TESTS / "test_store_contract.py" in modules
    for path in modules:
        tree = ast.parse(path.read_text())
        used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for proto in ports():
        untested = members(proto) - used
        assert not untested, f"{proto.__name__}: no contract test calls {sorted(untested)}"
