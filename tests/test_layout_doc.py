"""docs/layout.md names every module of src/cramkit, in the entry of its package: a module added without a word
on where it stands fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "cramkit"
LAYOUT = REPO / "docs" / "layout.md"
# folders whose files are one of a kind, named by the entry as a kind: a command per verb, a family per file
BY_KIND = ("commands", "model/architectures", "presets")


def _entries() -> dict[str, str]:
    """Each entry of the layout's tree (its names, e.g. "cli.py, commands/") -> its text."""
    block = LAYOUT.read_text(encoding="utf-8").split("```")[1]
    entries: dict[str, str] = {}
    head = None
    for line in block.splitlines():
        if re.match(r"  \S", line):
            head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            entries[head] = line
        elif head is not None:
            entries[head] += "\n" + line
    return entries


def _entry_for(entries: dict[str, str], name: str) -> str | None:
    return next((text for head, text in entries.items() if name in re.split(r",\s*", head)), None)


def test_the_layout_names_every_module() -> None:
    entries = _entries()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and len(rel.parts) > 1:
            continue
        if any(str(rel.parent) == kind or str(rel.parent).startswith(kind + "/") for kind in BY_KIND):
            continue
        if len(rel.parts) == 1:
            if _entry_for(entries, rel.name) is None:
                missing.append(str(rel))
            continue
        text = _entry_for(entries, rel.parts[0] + "/")
        if text is None or not re.search(rf"(?<![\w/]){re.escape(rel.stem)}(\.py)?\b", text):
            missing.append(str(rel))
    assert not missing, f"docs/layout.md does not say where these modules stand: {missing}"


# the suites that cross packages, beside the mirror of src/cramkit (docs/layout.md names them)
ACROSS = ("hostile", "parallel")


def test_the_tests_mirror_the_packages() -> None:
    tests = REPO / "tests"
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    stray = [f for f in folders if f not in packages and f not in ACROSS]
    assert not stray, f"tests/{stray[0]}/ is no package of src/cramkit: name it after the package its tests are about"
    layout = LAYOUT.read_text(encoding="utf-8")
    assert all(f"{name}/" in layout for name in ACROSS), "docs/layout.md names the suites that cross packages"
