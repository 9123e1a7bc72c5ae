"""The package's shape: imports run one way (lint-imports), no import cycle, one concept per module, a CLI is not a worker."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from celery import Celery

import celery_dlq

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(celery_dlq.__file__).parent


def find_cycle(graph) -> list[str] | None:
    """One import cycle of ``graph`` (every import, those inside functions included), or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(imported) == 1:
                return path[path.index(imported):] + [imported]
            if imported not in state:
                found = visit(imported)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph.modules):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = grimp.build_graph("celery_dlq", exclude_type_checking_imports=True, cache_dir=None)
    assert "celery_dlq.worker.runtime" in graph.modules
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = grimp.ImportGraph()
    for name in ("a", "b", "c"):
        graph.add_module(name)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    assert find_cycle(graph) is None
    graph.add_import(importer="c", imported="a")   # e.g. `def f(): from a import x`
    assert find_cycle(graph) == ["a", "b", "c", "a"]


def test_lint_imports_keeps_the_layers():
    """The contracts in pyproject.toml: layers top to bottom, and no worker import from cli/ops/analytics."""
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in proc.stdout


def module_trees() -> dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE)): ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}


def test_each_module_opens_by_naming_its_one_concept():
    """What the old 400-line rule stood for: a module holds one concept, and its docstring says which.

    Size is a question, not a rule (STYLE.md): no line count is enforced, so no file is split only to pass
    one. The first line of every module's docstring names what it holds.
    """
    trees = module_trees()
    assert len(trees) > 30
    missing = sorted(name for name, tree in trees.items() if not (ast.get_docstring(tree) or "").strip())
    assert missing == []
    rambling = sorted(name for name, tree in trees.items()
                      if len((ast.get_docstring(tree) or "").splitlines()[0]) > 160)
    assert rambling == [], "a module's first docstring line says its one concept in a sentence"


#: Functions longer than ~50 lines (STYLE.md), each a question asked and answered: why it is one step.
LONG_FUNCTIONS = {
    "web/app.py::create_app": "the routes, middleware and templates of one app, declared in one place",
}


def test_functions_stay_short():
    long = {f"{name}::{node.name}": node.end_lineno - node.lineno + 1
            for name, tree in module_trees().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 50}
    assert sorted(set(long) - set(LONG_FUNCTIONS)) == [], long
    assert sorted(set(LONG_FUNCTIONS) - set(long)) == [], "a listed function got short: drop it from the list"


def test_install_hands_its_runtime_to_the_bootsteps():
    from celery_dlq.worker.config import is_managed

    app = Celery("installed", broker="redis://localhost:1/0", set_as_current=False)
    runtime = celery_dlq.install(app)
    steps = {step.name: step for step in app.steps["consumer"]}
    assert set(steps) == {f"celery_dlq.worker.steps.{name}" for name in (
        "Settings", "BindConsumer", "FetchTransport", "KeepPoolIO", "CompactTracebacks", "DeadLetterDiscards",
        "UncountUnstarted", "FlushCounts")} | {"celery_dlq.worker.park.mover.Mover", "celery_dlq.worker.leader.jobs.RedriveJobs"}
    assert all(step.runtime is runtime for step in steps.values())
    assert all(steps["celery_dlq.worker.steps.Settings"] in step.requires
               for name, step in steps.items() if not name.endswith(".Settings")), "Settings goes first"
    assert celery_dlq.install(app) is runtime and len(app.steps["consumer"]) == 10   # idempotent
    assert is_managed(celery_dlq.RedeliveryTask) and not is_managed(app.tasks["celery.backend_cleanup"])


def listed_modules(text: str) -> set[str]:
    """Module paths named in docs/architecture.md's package listing (``celery_dlq/`` block), at any depth:
    a name ending in ``/`` opens a package whose entries are indented two more spaces."""
    block = text.split("```\ncelery_dlq/\n", 1)[1].split("```", 1)[0]
    found: set[str] = set()
    packages: dict[int, str] = {}   # indent -> the package path its entries are under
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        names = [name.strip() for name in line.strip().split("  ", 1)[0].split(",")]
        if indent % 2 or not names[0] or not (names[0].endswith("/") or names[0].endswith(".py")):
            continue   # a description's continuation line
        parent = packages.get(indent - 2, "") if indent > 2 else ""
        packages = {depth: path for depth, path in packages.items() if depth < indent}
        if names[0].endswith("/"):
            packages[indent] = parent + names[0]
        found.update(parent + n for n in names if n.endswith(".py"))
    return found


def test_the_architecture_doc_lists_every_module():
    root = Path(celery_dlq.__file__).parent
    modules = {str(p.relative_to(root)) for p in root.rglob("*.py")
               if p.name != "__init__.py" or p.parent == root}
    text = (root.parent / "docs" / "architecture.md").read_text()
    assert sorted(modules - listed_modules(text)) == [], "add them to docs/architecture.md's listing"


@pytest.mark.parametrize("module", ["celery_dlq", "celery_dlq.manage", "celery_dlq.ops", "celery_dlq.cli",
                                    "celery_dlq.exporter", "celery_dlq.web"])
def test_importing_the_operator_side_loads_no_worker_module(module):
    """The package root is lazy (PEP 562): an operator's process never loads the worker side."""
    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.startswith('celery_dlq.worker')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_package_root_still_gives_the_worker_names():
    code = ("import sys, celery_dlq; assert 'celery_dlq.worker.install' not in sys.modules; "
            "from celery_dlq import RedeliveryTask, install, delivery_count; "
            "assert RedeliveryTask.__module__ == 'celery_dlq.worker.run.task' and callable(install); "
            "assert set(celery_dlq.__all__) <= set(dir(celery_dlq))")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_the_operator_api_has_no_cycle_even_through_type_checking_imports():
    """ops/ imports one way (operator -> queue, groups, plan -> backend), annotations included."""
    graph = grimp.build_graph("celery_dlq", exclude_type_checking_imports=False, cache_dir=None)
    ops = grimp.ImportGraph()
    for module in graph.modules:
        if module.startswith("celery_dlq.ops."):
            ops.add_module(module)
    for module in ops.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported in ops.modules:
                ops.add_import(importer=module, imported=imported)
    assert "celery_dlq.ops.backend" in ops.find_modules_directly_imported_by("celery_dlq.ops.queue")
    assert find_cycle(ops) is None
