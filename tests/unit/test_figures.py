"""Every figure the documents cite is its results file's, and a figure whose code changed since says so.

A performance figure in README.md, BENCHMARKS.md or docs/*.md is followed by
a marker naming the results file its benchmark wrote (``bench/results/``,
written by ``bench/results.py``) and the figure's name in it::

    healthy p99 9.2 ms <!-- fig: storm-c7c5aa2.json healthy_p99_ms.dlq_breaker stale -->

The checks:

- the figure printed just before the marker is the file's, in the form the
  document prints it (a number rounded to the decimals shown, or a text
  such as "2.2 to 2.35 s" ending right before the marker);
- the file's commit is not older than the last commit that changed a path
  of its ``measures``, unless the marker says ``stale`` and the words next
  to it (its table row, or its paragraph) name the commit and say the code
  changed since. A commit listed in ``bench/unmeasured.json`` for that file
  (it changed a measured path, but no line the file's benchmark runs: the
  chord code, which no such benchmark calls) is passed over; each listed
  commit must have touched no ``celery_dlq/`` path outside the ones the
  entry names;
- in the scanned documents, a number with a performance unit (a ratio
  ``1.5x``, a share ``95%``, ``ms``, ``us``, ``MiB``, a rate ``/s``, decimal
  seconds) that no marker covers fails, unless it is on the small
  allowlist of settings and bounds below.
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
#: Commits passed over for the results files they name (see the module docstring).
UNMEASURED = ROOT / "bench" / "unmeasured.json"

#: Documents whose markers are checked.
CITING = ["README.md", "BENCHMARKS.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
#: Documents in which an uncited performance figure fails the test: all but the history, which keeps every
#: round as it was run (dated there, cited by nobody as today's figure).
SCANNED = [name for name in CITING if name != "docs/benchmarks-history.md"]

MARKER = re.compile(r"<!--\s*fig:\s*(?P<file>[\w.\-]+\.json)\s+(?P<name>[\w.\-]+)(?P<stale>\s+stale)?\s*-->")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
#: A number with a unit that makes it a performance figure.
FIGURE = re.compile(
    r"(?<![\w.,/-])[-+]?\d[\d,]*(?:\.\d+)?"
    r"(?:x(?!\w)"                                            # a ratio: 1.88x
    r"|\s?%"                                                 # a share: 95%, -17.1%
    r"|\s(?:ms|us|MiB)\b"                                    # latencies, memory
    r"|\s(?:tasks|retries|commands|msg|attempts|parks)/s\b"  # rates
    r"|(?<=\.\d)\s?s\b|(?<=\.\d\d)\s?s\b)"                   # decimal seconds: 6.1 s
)
#: Numbers with a unit that are settings, bounds computed from settings, or not measurements. Exact text.
ALLOWED = {
    "0.1 s": "the failure path's delay, a setting of the benchmark",
    "2.5 s": "dlq_heartbeat_interval's default",
    "12.5 s": "the recovery bound at the defaults: dlq_inflight_lease + dlq_heartbeat_interval",
    "22.5 s": "the recovery bound when the sweeper died too: two leases + one heartbeat interval",
    "5 ms": "the fetch listener's coalescing window, a constant of the code",
    "10 MiB": "the worker-memory test's allowance, a test constant",
    "1 MiB": "the archive's largest body kept whole, a constant",
    "0.2 s": "dlq_mover_interval's default, and the mover's local sleep before a due time",
    "0.5 s": "the demo's redelivery delay, a setting",
    "100 ms": "Redis's blocking-timeout granularity (its 10 Hz cron), and Dramatiq's retry jitter",
    "50 %": "the circuit breaker's default failure ratio, a setting",
    "2 %": "an example failure ratio the breaker's ratio leaves alone",
    "+300 %": "a worked example of the report's change column",
}
STALE_WORDS = re.compile(r"changed since|has changed|have changed|code changed", re.I)


@dataclass
class Git:
    root: Path
    _last: dict[tuple[str, ...], str] = field(default_factory=dict)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=self.root, capture_output=True, text=True, timeout=60)

    def last_change(self, paths: list[str], skip: frozenset[str] = frozenset()) -> str:
        """The last commit that changed one of ``paths``, passing over the commits in ``skip``."""
        key = (tuple(paths), skip)
        if key not in self._last:
            done = self.run("log", "--format=%H", "--", *paths)
            assert done.returncode == 0, done.stderr
            self._last[key] = next((c for c in done.stdout.split() if c not in skip), "")
        return self._last[key]

    def touched(self, commit: str) -> list[str]:
        done = self.run("show", "--name-only", "--format=", commit)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self.run("merge-base", "--is-ancestor", older, newer).returncode == 0

    def exists(self, commit: str) -> bool:
        return self.run("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


@cache
def git() -> Git:
    return Git(ROOT)


def mask_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked (offsets kept)."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group())
    text = re.sub(r"^```.*?^```", blank, text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", blank, text)


def block(text: str, pos: int) -> tuple[int, int]:
    """The table row holding ``pos``, or its paragraph: the words "next to" a figure."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    end = len(text) if end < 0 else end
    if text[start:end].lstrip().startswith("|"):
        return start, end
    para_start = text.rfind("\n\n", 0, pos)
    para_end = text.find("\n\n", pos)
    return (0 if para_start < 0 else para_start + 2), (len(text) if para_end < 0 else para_end)


def plain(s: str) -> str:
    """Markdown's emphasis and code marks dropped, line breaks and runs of spaces one space."""
    return re.sub(r"\s+", " ", s.replace("**", "").replace("`", ""))


def printed_at(text: str, start: int, end: int, value: object) -> tuple[str | None, int]:
    """What the document prints right before ``end`` for ``value``, and where it starts; None if not it."""
    before = MARKER.sub(lambda m: " " * len(m.group()), text[start:end])
    if isinstance(value, str):
        for i in range(len(before) - len(value), max(-1, len(before) - len(value) - 40), -1):
            if i >= 0 and plain(before[i:]).rstrip(" *_`)") == value:
                return value, start + i
        return None, end
    numbers = list(NUMBER.finditer(before))
    if not numbers:
        return None, end
    last = numbers[-1]
    tail = before[last.end():]
    if len(tail) > 30 or re.search(r"[\d(]", tail):
        return None, end
    shown = last.group()
    digits = shown.lstrip("+").replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    try:
        same = format(float(value), f".{decimals}f") == digits  # type: ignore[arg-type]
    except (TypeError, ValueError):
        same = False
    return (shown if same else None), start + last.start()


REQUIRED = ("benchmark", "commit", "date", "machine", "command", "measures", "figures")
MACHINE = ("cores", "cpu_model", "python", "redis_server")


def load_results(path: Path, root: Path, repo: Git) -> tuple[dict | None, list[str]]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, [f"{path.name}: {exc}"]
    problems = [f"{path.name}: no {key!r}" for key in REQUIRED if key not in record]
    problems += [f"{path.name}: machine has no {key!r}" for key in MACHINE if key not in record.get("machine", {})]
    commit = str(record.get("commit", ""))
    if not re.fullmatch(r"[0-9a-f]{40}", commit) or not repo.exists(commit):
        problems.append(f"{path.name}: commit {commit!r} is not a commit of this repository")
    measures = record.get("measures") or []
    if not measures:
        problems.append(f"{path.name}: 'measures' names no path")
    # A path renamed or deleted since still has its history (its removal makes the figure stale); a typo has none.
    problems += [f"{path.name}: measures {p!r}, which this repository never held" for p in measures
                 if not (root / p).exists() and not repo.last_change([p])]
    return record, problems


def unmeasured(path: Path = UNMEASURED) -> dict[str, frozenset[str]]:
    """Results file name -> the commits passed over for it (``bench/unmeasured.json``)."""
    skips: dict[str, set[str]] = {}
    for entry in json.loads(path.read_text())["changes"] if path.exists() else ():
        for name in entry["files"]:
            skips.setdefault(name, set()).update(entry["commits"])
    return {name: frozenset(commits) for name, commits in skips.items()}


def check(docs: dict[str, str], results: Path, root: Path, repo: Git,
          skips: dict[str, frozenset[str]] | None = None) -> tuple[list[str], dict[str, list]]:
    """Every marker's figure against its file, and its staleness; returns the problems and the covered spans."""
    skips = {} if skips is None else skips
    problems: list[str] = []
    covered: dict[str, list[tuple[int, int]]] = {}
    cache_: dict[str, tuple[dict | None, list[str]]] = {}
    for name, text in docs.items():
        for m in MARKER.finditer(text):
            where = f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
            path = results / m["file"]
            if m["file"] not in cache_:
                cache_[m["file"]] = load_results(path, root, repo) if path.exists() else (None, [])
                problems += cache_[m["file"]][1]
            record = cache_[m["file"]][0]
            if record is None:
                problems.append(f"{where}: cites {m['file']}, which is not in {results.relative_to(root)}")
                continue
            figures = record.get("figures", {})
            if m["name"] not in figures:
                problems.append(f"{where}: {m['file']} has no figure {m['name']!r}")
                continue
            value = figures[m["name"]]
            start, _ = block(text, m.start())
            shown, at = printed_at(text, start, m.start(), value)
            if shown is None:
                got = text[max(start, m.start() - 40):m.start()].strip()
                problems.append(f"{where}: {m['file']} {m['name']} is {value!r}; the document says ...{got!r}")
            covered.setdefault(name, []).append((at, m.end()))
            commit = str(record.get("commit", ""))
            last = repo.last_change(list(record.get("measures") or ["."]), skips.get(m["file"], frozenset()))
            current = not record.get("dirty") and bool(last) and repo.is_ancestor(last, commit)
            if current:
                continue
            if not m["stale"]:
                problems.append(f"{where}: {m['file']} was measured at {commit[:7]}, and {last[:7]} changed "
                                f"{', '.join(record.get('measures', []))} since: mark the figure stale in words "
                                f"and in its marker, or re-measure")
                continue
            lo, hi = block(text, m.start())
            context = text[lo:hi]
            if commit[:7] not in context or not STALE_WORDS.search(context):
                problems.append(f"{where}: {m['name']} is marked stale, but the words next to it do not name "
                                f"{commit[:7]} and say the code changed since")
    return problems, covered


def scan(name: str, text: str, covered: list[tuple[int, int]]) -> list[str]:
    """Performance figures in ``text`` that no marker covers and the allowlist does not name."""
    masked = mask_code(MARKER.sub(lambda m: " " * len(m.group()), text))
    problems = []
    for m in FIGURE.finditer(masked):
        if plain(m.group()) in ALLOWED or any(lo <= m.start() < hi for lo, hi in covered):
            continue
        line = text.count("\n", 0, m.start()) + 1
        problems.append(f"{name}:{line}: {m.group()!r} looks like a measured figure and cites no results file")
    return problems


def read_docs(names: list[str]) -> dict[str, str]:
    return {name: (ROOT / name).read_text() for name in names if (ROOT / name).exists()}


# --- the repository's documents ---------------------------------------------------------------------------

def test_every_cited_figure_is_its_results_files_and_current_or_marked_stale():
    problems, _ = check(read_docs(CITING), RESULTS, ROOT, git(), unmeasured())
    assert problems == []


def test_no_marker_opens_a_line():
    """A line opening with ``<!--`` starts an HTML block in Markdown and breaks its paragraph: keep the marker
    on the figure's line."""
    opening = [f"{name}:{i}" for name, text in read_docs(CITING).items()
               for i, line in enumerate(text.splitlines(), 1) if re.match(r" {0,3}<!--\s*fig:", line)]
    assert opening == []


def test_the_scanned_documents_hold_no_uncited_performance_figure():
    docs = read_docs(SCANNED)
    _, covered = check(docs, RESULTS, ROOT, git())
    problems = [p for name, text in docs.items() for p in scan(name, text, covered.get(name, []))]
    assert problems == []


def test_every_results_file_is_complete_and_cited():
    files = sorted(RESULTS.glob("*.json"))
    assert files, "bench/results/ holds no results file"
    cited = {m["file"] for text in read_docs(CITING).values() for m in MARKER.finditer(text)}
    problems = [p for path in files for p in load_results(path, ROOT, git())[1]]
    problems += [f"{path.name}: cited by no document" for path in files if path.name not in cited]
    for path in files:
        record = json.loads(path.read_text())
        if "origin" in record:   # transcribed from a recorded round: it says which
            assert re.match(r"transcribed from \S", record["origin"]), path.name
    assert problems == []


def test_every_passed_over_commit_touched_only_the_paths_its_entry_names():
    """bench/unmeasured.json may pass over a commit only for code its files' benchmarks never run: the commit
    exists, changed no celery_dlq/ path beyond the entry's, and names results files that exist."""
    if not UNMEASURED.exists():
        return
    problems = []
    for entry in json.loads(UNMEASURED.read_text())["changes"]:
        assert entry["why"] and entry["paths"] and entry["commits"] and entry["files"], entry
        for commit in entry["commits"]:
            if not re.fullmatch(r"[0-9a-f]{40}", commit) or not git().exists(commit):
                problems.append(f"{commit}: not a commit of this repository")
                continue
            beyond = [p for p in git().touched(commit) if p.startswith("celery_dlq/") and p not in entry["paths"]]
            problems += [f"{commit[:7]} changed {p}, which its entry does not name" for p in beyond]
        problems += [f"{name}: no such results file" for name in entry["files"] if not (RESULTS / name).exists()]
    assert problems == []


# --- the checker itself, on a fixture -----------------------------------------------------------------------

MEASURED = ["celery_dlq/storage/"]


@pytest.fixture
def fixture(tmp_path):
    """A results file measured at the last commit that changed its path, and a document citing it."""
    results = tmp_path / "results"
    results.mkdir()
    last = git().last_change(MEASURED)
    record = {"benchmark": "fixture", "commit": last, "date": "2026-12-01T00:00:00Z",
              "machine": {"cores": 2, "cpu_model": "x", "python": "3.11.7", "redis_server": "7.0.15"},
              "command": "bench/fixture.py", "measures": MEASURED,
              "figures": {"p99_ms": 9.24, "ratio": 1.88, "range": "2.2 to 2.35 s", "rate": 9871}}

    def write(**changes):
        (results / "run.json").write_text(json.dumps({**record, **changes}))

    write()
    doc = ("The p99 was **9.2 ms** <!-- fig: run.json p99_ms -->, 1.88x <!-- fig: run.json ratio --> a quiet "
           "run's; promotion 2.2 to 2.35 s <!-- fig: run.json range -->; "
           "9,871 retries/s <!-- fig: run.json rate -->.\n")
    return results, write, doc, record


def run_check(results: Path, doc: str) -> list[str]:
    return check({"doc.md": doc}, results, ROOT, git())[0]


def test_the_fixture_passes(fixture):
    results, _, doc, _ = fixture
    assert run_check(results, doc) == []


def test_a_doctored_figure_fails(fixture):
    results, write, doc, record = fixture
    write(figures={**record["figures"], "p99_ms": 9.31})
    [problem] = run_check(results, doc)
    assert "p99_ms is 9.31" in problem
    write(figures={**record["figures"], "range": "2.2 to 2.4 s"})
    assert len(run_check(results, doc)) == 1
    write()
    assert len(run_check(results, doc.replace("9,871", "9,872"))) == 1   # a doctored document fails as well


def test_a_commit_moved_back_fails_unless_the_document_says_stale(fixture):
    results, write, doc, record = fixture
    older = git().run("rev-parse", f"{record['commit']}^").stdout.strip()
    write(commit=older)
    problems = run_check(results, doc)
    assert len(problems) == 4 and all("mark the figure stale" in p for p in problems)
    marked = MARKER.sub(lambda m: m.group().replace(" -->", " stale -->"), doc)
    assert len(run_check(results, marked)) == 4   # the marker alone is not enough: the words must say so
    worded = marked.replace(".\n", f" (measured at {older[:7]}; the code changed since).\n")
    assert run_check(results, worded) == []
    write(dirty=True)   # a run on uncommitted changes belongs to no commit
    assert len(run_check(results, doc)) == 4


def test_a_passed_over_commit_is_skipped_for_the_files_it_names_only(fixture):
    results, write, doc, record = fixture
    older = git().run("rev-parse", f"{record['commit']}^").stdout.strip()
    write(commit=older)
    skip = frozenset({record["commit"]})
    assert check({"doc.md": doc}, results, ROOT, git(), {"run.json": skip})[0] == []
    assert len(check({"doc.md": doc}, results, ROOT, git(), {"other.json": skip})[0]) == 4


def test_a_measured_path_must_be_one_the_repository_held(fixture):
    results, write, doc, record = fixture
    write(measures=["celery_dlq/storage/", "celery_dlq/no_such_module.py"])
    assert any("never held" in p for p in run_check(results, doc))
    write(measures=["celery_dlq/storage/", "celery_dlq/redis/"])   # held once, renamed to storage/ since
    assert not any("never held" in p for p in run_check(results, doc))


def test_a_figure_nobody_cites_fails_the_scan(fixture):
    results, _, doc, _ = fixture
    text = doc + "\nUnder load it made 1.47x the commands, 12.0 ms at p99, 95% less CPU and 350 tasks/s.\n"
    _, covered = check({"doc.md": text}, results, ROOT, git())
    found = [p.split(": ")[1] for p in scan("doc.md", text, covered["doc.md"])]
    assert found == ["'1.47x' looks like a measured figure and cites no results file",
                     "'12.0 ms' looks like a measured figure and cites no results file",
                     "'95%' looks like a measured figure and cites no results file",
                     "'350 tasks/s' looks like a measured figure and cites no results file"]
    allowed = "A worker silent past the lease is back within 12.5 s; `1.5x` in code is not prose.\n"
    assert scan("doc.md", allowed, []) == []
