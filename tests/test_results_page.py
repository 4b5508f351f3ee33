"""bench/RESULTS.md is evidence: every script it names is in bench/, and it names no one machine's folders (a
temporary script, a virtual environment) that a reader cannot open."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "bench" / "RESULTS.md"


def test_results_cite_no_machine_s_folders() -> None:
    text = PAGE.read_text(encoding="utf-8")
    found = [
        f"line {text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
        for m in re.finditer(r"(?<![\w.$])(/tmp/|/home/|/work/|/root/)\S*|\S*(\.venv/|site-packages/)\S*", text)
    ]
    assert not found, "a figure's script belongs in bench/ (name machine folders as $SITE, $M, ...):\n" + "\n".join(
        found
    )


def test_every_bench_script_results_name_exists() -> None:
    text = PAGE.read_text(encoding="utf-8")
    named = set(re.findall(r"bench/([\w-]+\.(?:py|sh))", text))
    missing = sorted(n for n in named if not (REPO / "bench" / n).is_file())
    assert not missing, f"RESULTS.md names scripts bench/ does not have: {missing}"


def test_every_section_the_readme_cites_is_on_the_page() -> None:
    """The README's figures name their section of RESULTS.md (the table's last column, in quotes): each is the
    start of one of its headings, so a reader finds the commands and the machine behind every figure."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## What we measured") :].split("\n## ", 1)[0]
    cited = [
        name
        for row in table.splitlines()
        if row.startswith("| ")
        for name in re.findall(r'"([^"]+)"', row.rsplit("|", 2)[-2])
    ]
    headings = [h.lstrip("#").strip() for h in PAGE.read_text(encoding="utf-8").splitlines() if h.startswith("##")]
    assert len(cited) >= 10
    missing = [name for name in cited if not any(h.startswith(name) for h in headings)]
    assert not missing, f"README.md cites sections RESULTS.md does not have: {missing}"
