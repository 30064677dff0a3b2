"""The documentation's shape: README is a short front door, depth lives in docs/.

Checks what a reader (and the benchmarks that publish tables) rely on: README stays short and
has a table of contents, each topic page in docs/ opens with its own, every relative link and
#anchor in README and docs/ points at a file and heading that exist, and each benchmark that
writes a table finds its markers in the docs file that holds that table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPICS = (
    "memory",
    "benchmarks",
    "reliability",
    "meshtastic",
    "meshcore",
    "discord",
    "bridge",
    "postgresql",
    "operations",
    "troubleshooting",
    "development",
)


def _headings(text: str) -> list[str]:
    out, code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            code = not code
        elif not code and (m := re.match(r"^#+ (.*)", line)):
            out.append(m.group(1).strip())
    return out


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_readme_is_a_short_front_door_with_contents() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert "**Contents**" in text.split("\n## ", 1)[0]
    for command in ("make chat", "make test", "systemd/install.sh", "docker run"):
        assert command in text, command
    for topic in TOPICS:
        assert f"](docs/{topic}.md)" in text, f"README does not link docs/{topic}.md"


@pytest.mark.parametrize("topic", TOPICS)
def test_each_topic_page_opens_with_its_contents(topic: str) -> None:
    text = (ROOT / "docs" / f"{topic}.md").read_text(encoding="utf-8")
    assert text.startswith("# ")
    first_section = text.find("\n## ")
    contents = text.find("**Contents**")
    assert 0 < contents < first_section, f"docs/{topic}.md: no contents before the first section"


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and dest.is_file():
                anchors = {_anchor(h) for h in _headings(dest.read_text(encoding="utf-8"))}
                if fragment not in anchors:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    ("doc", "start", "end"),
    [
        ("docs/benchmarks.md", "<!-- bench:pipeline:start -->", "<!-- bench:pipeline:end -->"),
        ("docs/pipeline.md", "<!-- bench:pipeline:start -->", "<!-- bench:pipeline:end -->"),
        ("docs/benchmarks.md", "<!-- bench:gateways:start -->", "<!-- bench:gateways:end -->"),
        ("docs/benchmarks.md", "<!-- mesh_load:begin -->", "<!-- mesh_load:end -->"),
        ("docs/memory.md", "<!-- bench:prefix:start -->", "<!-- bench:prefix:end -->"),
        ("docs/memory.md", "<!-- bench:memory_e2e:start -->", "<!-- bench:memory_e2e:end -->"),
        ("docs/memory.md", "<!-- bench:real_llm:start -->", "<!-- bench:real_llm:end -->"),
        ("docs/real_llm.md", "<!-- bench:real_llm:start -->", "<!-- bench:real_llm:end -->"),
    ],
)
def test_published_tables_live_in_docs_where_their_benchmark_writes(
    doc: str, start: str, end: str
) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert text.count(start) == 1 and text.count(end) == 1
    assert text.index(start) < text.index(end)
    assert start not in (ROOT / "README.md").read_text(encoding="utf-8")


def test_benchmarks_write_into_docs_not_readme(tmp_path: Path) -> None:
    from bench import mesh_load, pipeline, prefix, real_llm

    assert prefix.MEMORY_DOC == ROOT / "docs" / "memory.md"
    assert real_llm.MEMORY_DOC == ROOT / "docs" / "memory.md"
    assert pipeline.HEADLINE == ROOT / "docs" / "benchmarks.md"
    assert pipeline.parse_args([]).headline == str(ROOT / "docs" / "benchmarks.md")
    copy = tmp_path / "benchmarks.md"
    copy.write_text((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"))
    mesh_load._write_docs("| people |\n|---|\n| 99 |\n", copy)
    text = copy.read_text(encoding="utf-8")
    assert "<!-- mesh_load:begin -->\n| people |\n|---|\n| 99 |\n<!-- mesh_load:end -->" in text
    assert "## Mesh load" in text and "## Several gateways on PostgreSQL" in text


def _text_files() -> list[Path]:
    """The repository's own text: code, docs, config, scripts (no venv, caches or results)."""
    skip = {".git", ".venv", "build", "results", "__pycache__", ".mypy_cache", ".ruff_cache"}
    suffixes = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".service", ".timer", ".txt"}
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(part in skip or part.endswith(".egg-info") for part in rel):
            continue
        if path.is_file() and (path.suffix in suffixes or path.name in {"Makefile", "Dockerfile"}):
            out.append(path)
    return out


# How the software was built (who ran what, when, in which checkout) belongs in the issue
# tracker; the repository speaks of the product. Split so this file does not match itself.
AUTHORSHIP = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bcoordi" r"nator",
        r"\bhelper" r"s?\s+h\d",
        r"\bhelper" r"s' ",
        r"\bh1\d[a-z]\b",
        r"\bwork" r"trees?\b",
        r"\bst" r"ops? \d+\b",
        r"\b(this|last|previous|that) sess" r"ion's (deadline|start|end)",
        r"\bwork " r"notes?\b",
        r"docs/chan" r"ges",
    )
]


def test_no_file_speaks_of_who_built_it() -> None:
    found = []
    for path in _text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
            if any(p.search(line) for p in AUTHORSHIP):
                found.append(f"{path.relative_to(ROOT)}:{n + 1}: {line.strip()[:100]}")
    assert not found, "say what the software does, not who ran what:\n" + "\n".join(found)


def test_changelog_lists_versions_newest_first_and_matches_the_package() -> None:
    import tomllib

    from bot import __version__

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", text, re.MULTILINE)
    assert versions, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' entry"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert versions[0][0] == project["version"] == __version__
    keys = [tuple(int(x) for x in v.split(".")) for v, _ in versions]
    assert keys == sorted(keys, reverse=True), "versions must be newest first"
    assert [d for _, d in versions] == sorted((d for _, d in versions), reverse=True)
    for section in re.findall(r"^### (.+)$", text, re.MULTILINE):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert not (ROOT / "docs" / "changes").exists()
