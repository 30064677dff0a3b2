"""No import runs upward: the house's lower floors (memory, transports, llm, the bottom
modules) never import the operations floor (bot.ops), the wiring (bot.app) or the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "bot"
LOWER = [
    "memory",
    "transports",
    "llm",
    "files.py",
    "domain.py",
    "errors.py",
    "text.py",
    "urls.py",
    "config_schema.py",
]
UPPER = ("bot.ops", "bot.app", "bot.cli")


def _modules() -> list[Path]:
    out: list[Path] = []
    for name in LOWER:
        p = ROOT / name
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_lower_modules_do_not_import_upward(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    upward = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        upward += [n for n in names for u in UPPER if n == u or n.startswith(u + ".")]
    assert upward == [], f"{path} imports {upward}"


def test_file_mode_helpers_live_at_the_bottom() -> None:
    assert (ROOT / "files.py").is_file()
    assert not (ROOT / "ops" / "files.py").exists()


# A part split out of a larger room sits below the room that composes it: the part never
# imports its composer (issue 19 point 5).
PARTS = [
    ("delivery.py", "bot.responder"),
    ("limits.py", "bot.responder"),
    ("config_schema.py", "bot.config"),
]


@pytest.mark.parametrize(("part", "composer"), PARTS, ids=[p for p, _ in PARTS])
def test_split_parts_do_not_import_their_composer(part: str, composer: str) -> None:
    tree = ast.parse((ROOT / part).read_text(encoding="utf-8"))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert composer not in imported, f"bot/{part} imports {composer}"
