"""tests/ci_skips.py: with CI=true a run that skipped anything fails and names it; without CI a skip is a skip."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import pytest


def test_runs():
    assert True


def test_skips():
    pytest.skip("no RabbitMQ here")


@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
'''

IMPORTORSKIP = '''
import pytest

pytest.importorskip("celery_dlq_no_such_module")


def test_never_collected():
    assert True
'''

ONLY_PASSING = '''
def test_runs():
    assert True
'''


def run_pytest(tmp_path: Path, files: dict[str, str], ci: str | None, *args: str) -> subprocess.CompletedProcess:
    """pytest with tests/ci_skips.py as a plugin on ``files`` (written to ``tmp_path``), or on ``tmp_path`` when
    one of them is a conftest; ``ci`` is CI's value (None: unset)."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    targets = ["."] if any(name.endswith("conftest.py") for name in files) else list(files)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.ci_skips", "-p", "no:cacheprovider",
                           "-q", *args, *targets], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_in_ci_a_skipped_test_fails_the_run_and_is_named(tmp_path):
    run = run_pytest(tmp_path, {"test_some.py": TESTS}, "true")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "CI=true: 1 skipped, which fails the run" in run.stdout
    assert "SKIPPED test_some.py::test_skips: no RabbitMQ here" in run.stdout
    assert "test_expected_failure" not in run.stdout.split("which fails the run")[1].split("\n=")[0]


def test_in_ci_an_importorskip_at_collection_fails_the_run(tmp_path):
    run = run_pytest(tmp_path, {"test_module.py": IMPORTORSKIP, "test_other.py": ONLY_PASSING}, "1")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "SKIPPED test_module.py: could not import 'celery_dlq_no_such_module'" in run.stdout


def test_in_ci_a_skip_in_a_sub_directorys_conftest_fails_the_run(tmp_path):
    run = run_pytest(tmp_path, {"spark/conftest.py": IMPORTORSKIP.replace("def test_never_collected", "def unused"),
                                "spark/test_report.py": ONLY_PASSING, "test_other.py": ONLY_PASSING}, "true")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "SKIPPED spark: could not import 'celery_dlq_no_such_module'" in run.stdout


def test_in_ci_under_xdist_the_controller_sees_every_workers_skips(tmp_path):
    run = run_pytest(tmp_path, {"test_some.py": TESTS, "test_module.py": IMPORTORSKIP}, "true", "-n", "2")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "CI=true: 2 skipped, which fails the run" in run.stdout
    assert "test_some.py::test_skips" in run.stdout and "test_module.py" in run.stdout


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_outside_ci_a_skip_is_a_skip(tmp_path, ci):
    run = run_pytest(tmp_path, {"test_some.py": TESTS}, ci)
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert "1 skipped" in run.stdout and "fails the run" not in run.stdout


def test_in_ci_a_run_without_skips_passes(tmp_path):
    run = run_pytest(tmp_path, {"test_other.py": ONLY_PASSING}, "true")
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert "fails the run" not in run.stdout


def test_in_ci_a_failing_run_keeps_its_status(tmp_path):
    failing = TESTS + "\n\ndef test_fails():\n    assert False\n"
    run = run_pytest(tmp_path, {"test_some.py": failing}, "true")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "CI=true: 1 skipped" in run.stdout


def test_the_suites_conftest_loads_the_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("tests.ci_skips")
