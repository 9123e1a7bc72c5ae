"""Habits the project keeps, checked: short commit subjects, one place for each thing (docs/architecture.md)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_dlq"
#: The first commit under the 72-character rule; earlier subjects are history.
RULE_FROM = "8508dd3"
MAX_SUBJECT = 72


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_commit_subjects_since_the_rule_are_under_72_characters():
    known = subprocess.run(["git", "cat-file", "-e", f"{RULE_FROM}^{{commit}}"], cwd=ROOT).returncode == 0
    # A shallow clone may not hold the rule's first commit: then check the commits it holds.
    subjects = git("log", "--format=%s", f"{RULE_FROM}^..HEAD" if known else "-50").splitlines()
    assert subjects, "no commits found"
    assert [s for s in subjects if len(s) > MAX_SUBJECT] == []


def one_place_rows(text: str) -> list[tuple[str, set[str], str]]:
    """``(what, {module paths}, pattern)`` of the "One place for each" table of docs/architecture.md."""
    section = text.split("## One place for each", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))] if line.startswith("|") else []
        if len(cells) != 3 or cells[0] in ("what", "") or set(cells[0]) <= {"-"}:
            continue
        places = set(re.findall(r"`([\w/]+\.py)`", cells[1]))
        (pattern,) = re.findall(r"`([^`]+)`", cells[2].replace("\\|", "|"))
        rows.append((cells[0].split(" (")[0], places, pattern))
    return rows


def where(pattern: str) -> set[str]:
    found = re.compile(pattern)
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if found.search(p.read_text())}


def test_each_thing_is_done_in_the_one_place_the_architecture_doc_names():
    rows = one_place_rows((ROOT / "docs" / "architecture.md").read_text())
    assert {what for what, _, _ in rows} >= {"recording a dead letter", "selecting letters", "moving letters",
                                              "reading the parked store"}
    for what, places, pattern in rows:
        assert places and all((PACKAGE / p).exists() for p in places), what
        assert where(pattern) == places, f"{what}: `{pattern}` belongs in {sorted(places)} only"


def test_the_one_place_check_finds_a_second_place():
    assert where(r"def compute_delay\(") == {"policy.py"}
    assert len(where(r"from __future__ import annotations")) > 30


def test_the_architecture_docs_layer_table_is_the_import_linter_contract():
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layered,) = [c for c in contracts if c["type"] == "layers"]
    enforced = [{name.strip() for name in re.split(r"[|:]", layer)} for layer in layered["layers"]]
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Layers and which way imports go", 1)[1].split("\n## ", 1)[0]
    documented = [set(re.findall(r"`(\w+)`", re.split(r"(?<!\\)\|", line)[1])) for line in table.splitlines()
                  if line.startswith("| `")]
    assert documented == enforced
