#!/usr/bin/env python3
"""Run a subset of Celery's own integration suite twice: plain, and with every task a ``RedeliveryTask``.

    python scripts/celery_suite.py [--suite tasks|canvas] [--tests t/integration/test_tasks.py ...] [-k EXPR]
                                   [--chord-rule wait|fail|continue] [--side both|plain|dlq] [--workdir DIR]

Downloads the sdist of the Celery version installed here (the suite ships in
it, under ``t/integration``), makes a virtualenv in the work directory with
this checkout, the suite's own needs and pytest, starts a redis-server of its
own on a free port (broker and result backend), then runs the chosen tests in
two copies of the tree: as shipped, and with a ``celery_parameters`` fixture
that makes ``celery_dlq:RedeliveryTask`` the app's task class (every
``@shared_task`` then is one, and ``install()`` runs when they bind). Prints
each side's counts and every test whose outcome differs, and writes them
with the run's date and commit to ``<workdir>/<suite>-<tree>-<side>-summary.json``
(docs/celery-suite.md). ``--suite canvas`` runs ``t/integration/test_canvas.py``
without the suite's reruns of flaky tests (``-p no:rerunfailures``, both
sides): under the default chord rule ``wait`` a chord whose member fails for
good stays open, and each rerun would wait out the test's timeout again.
``--chord-rule`` makes every task's policy set that chord rule (its own tree,
``dlq-<rule>``). ``--side`` runs one side only and compares it with the other
side's report from an earlier run in the same work directory, if there is one
(two invocations, one per side, may run at once once the first has made the
virtualenv). Not part of ``scripts/test.sh``: each suite takes tens of minutes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"tasks": ["t/integration/test_tasks.py", "t/integration/test_inspect.py"],
          "canvas": ["t/integration/test_canvas.py"]}
#: pytest options a suite adds on both sides.
SUITE_OPTIONS = {"tasks": [], "canvas": ["-p", "no:rerunfailures"]}
SUITE_NEEDS = ["pydantic", "pytest", "pytest-timeout", "pytest-rerunfailures", "redis"]
SHIM = '''

# --- added by celery-dlq's scripts/celery_suite.py: every task a RedeliveryTask ---
@pytest.fixture(scope='session')
def celery_parameters():
    return {"task_cls": "celery_dlq:RedeliveryTask"}
'''
#: The shim under ``--chord-rule``: every task a RedeliveryTask whose policy sets that rule.
RULE_SHIM = '''

# --- added by celery-dlq's scripts/celery_suite.py: every task a RedeliveryTask, chord rule {rule!r} ---
import celery_dlq


class SuiteTask(celery_dlq.RedeliveryTask):
    redelivery_policy = {{"chord_rule": {rule!r}}}


@pytest.fixture(scope='session')
def celery_parameters():
    return {{"task_cls": SuiteTask}}
'''


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def celery_version() -> str:
    import celery
    return celery.__version__


def prepare(workdir: Path, rule: str | None) -> tuple[Path, Path, Path]:
    """(venv python, plain tree, celery-dlq tree)."""
    version = celery_version()
    workdir.mkdir(parents=True, exist_ok=True)
    sdist = workdir / f"celery-{version}.tar.gz"
    if not sdist.exists():
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"celery=={version}", "-d", str(workdir)])
    trees = []
    for name in ("plain", f"dlq-{rule}" if rule else "dlq"):
        tree = workdir / name
        if not tree.exists():
            with tarfile.open(sdist) as tar:
                tar.extractall(workdir / f"_{name}", filter="data")
            shutil.move(str(workdir / f"_{name}" / f"celery-{version}"), tree)
            shutil.rmtree(workdir / f"_{name}")
            if name != "plain":
                conftest = tree / "t" / "integration" / "conftest.py"
                conftest.write_text(conftest.read_text() + (RULE_SHIM.format(rule=rule) if rule else SHIM))
        trees.append(tree)
    venv = workdir / ".venv"
    python = venv / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", "-e", str(ROOT), f"celery[redis]=={version}", *SUITE_NEEDS])
    return python, trees[0], trees[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outcomes(junit: Path) -> dict[str, str]:
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        result[name] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds
                        else "passed")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="tasks")
    parser.add_argument("--tests", nargs="+", default=None, help="instead of the suite's files")
    parser.add_argument("-k", dest="keyword", default=None)
    parser.add_argument("--chord-rule", choices=["wait", "fail", "continue"], default=None,
                        help="every task's policy sets this chord rule (default: the policy's default, wait)")
    parser.add_argument("--side", choices=["both", "plain", "dlq"], default="both")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".celery-suite")
    args = parser.parse_args()
    tests = args.tests or SUITES[args.suite]
    python, plain, dlq = prepare(args.workdir, args.chord_rule)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    results, counts = {}, {}
    try:
        for name, tree in (("plain", plain), ("RedeliveryTask", dlq)):
            if args.side not in ("both", "plain" if tree is plain else "dlq"):
                continue
            junit = args.workdir / f"{args.suite}-{tree.name}.xml"
            subprocess.run(["redis-cli", "-p", str(port), "FLUSHALL"], stdout=subprocess.DEVNULL)
            env = {"TEST_BROKER": f"redis://127.0.0.1:{port}/0", "TEST_BACKEND": f"redis://127.0.0.1:{port}/1",
                   "PATH": "/usr/bin:/bin:/usr/local/bin"}
            cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "celery.contrib.pytest",
                   "-W", "ignore", f"--junitxml={junit}", "--timeout=120", *SUITE_OPTIONS[args.suite], *tests]
            if args.keyword:
                cmd += ["-k", args.keyword]
            started = time.monotonic()
            subprocess.run(cmd, cwd=tree, env=env)
            results[name] = outcomes(junit)
            counts[name] = {k: sum(v == k for v in results[name].values()) for k in ("passed", "failed", "skipped")}
            counts[name]["seconds"] = round(time.monotonic() - started)
            print(f"{name}: {counts[name]}", flush=True)
    finally:
        server.terminate()
    for name, tree in (("plain", plain), ("RedeliveryTask", dlq)):
        junit = args.workdir / f"{args.suite}-{tree.name}.xml"
        if name not in results and junit.exists():   # the other side's report, read once this side has run
            results[name] = outcomes(junit)
            print(f"{name}: read from {junit}", flush=True)
    plain_r, dlq_r = results.get("plain", {}), results.get("RedeliveryTask", {})
    differ = sorted(t for t in set(plain_r) | set(dlq_r) if plain_r.get(t) != dlq_r.get(t)) \
        if plain_r and dlq_r else []
    print(f"\n{len(differ)} test(s) differ:")
    for test in differ:
        print(f"  {test}: plain {plain_r.get(test)}, RedeliveryTask {dlq_r.get(test)}")
    summary = {"suite": args.suite, "tests": tests, "date": date, "commit": commit, "celery": celery_version(),
               "chord_rule": args.chord_rule, "side": args.side, "counts": counts,
               "differ": {t: [plain_r.get(t), dlq_r.get(t)] for t in differ}}
    name = f"{args.suite}-{dlq.name}-{args.side}-summary.json"
    (args.workdir / name).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
