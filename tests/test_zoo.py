"""The test zoo rebuilds an artefact when a file it depended on changed, and only then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zoo


@pytest.fixture
def own_zoo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A zoo in ``tmp_path`` and a snapshot of the files the test may edit."""
    monkeypatch.setattr(zoo, "ROOT", tmp_path)
    files = dict(zoo.snapshot())
    monkeypatch.setattr(zoo, "snapshot", lambda: files)
    return files


def _build(path: Path) -> None:
    from cramkit.train.budget import parse_budget

    path.mkdir()
    (path / "budget.txt").write_text(repr(parse_budget("10steps")), encoding="utf-8")


def test_an_artefact_is_rebuilt_when_a_file_it_ran_changes_and_only_then(own_zoo: dict[str, str]) -> None:
    built = zoo.artefact("budget", ["r"], _build)
    deps = json.loads((built / zoo.DEPS).read_text(encoding="utf-8"))
    assert "src/cramkit/train/budget.py" in deps and "tests/test_zoo.py" in deps
    assert not any(d.startswith("src/cramkit/serve/") for d in deps)

    own_zoo["src/cramkit/serve/app.py"] = "edited"  # the server: not something the build ran
    assert zoo.artefact("budget", ["r"], _build) == built

    own_zoo["src/cramkit/train/budget.py"] = "edited"
    again = zoo.artefact("budget", ["r"], _build)
    assert again != built and (again / "budget.txt").is_file()
    assert zoo.artefact("budget", ["other recipe"], _build) not in (built, again)


def test_only_the_most_recently_used_versions_are_kept(own_zoo: dict[str, str]) -> None:
    made = []
    for i in range(zoo.KEEP + 2):
        own_zoo["src/cramkit/train/budget.py"] = f"edit {i}"
        made.append(zoo.artefact("budget", [], _build))
    assert [p.is_dir() for p in made] == [False, False] + [True] * zoo.KEEP


def test_a_failed_build_leaves_nothing(own_zoo: dict[str, str], tmp_path: Path) -> None:
    def broken(path: Path) -> None:
        path.mkdir()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        zoo.artefact("broken", [], broken)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]
