"""A pytest plugin: in CI (``CI=true``) a run that skipped anything fails, and says what it skipped.

tests/conftest.py loads it for every run of the suite (and the contract
sessions, which copy tests/); ``-p tests.ci_skips`` loads it elsewhere.
Outside CI a skip stays a skip (a laptop without RabbitMQ or Spark), and
:func:`tests.services.missing` already fails in CI with how to get what is
missing: this catches every other skip, ``importorskip`` and ``skipif``
included, so a CI run can never go green without tests it did not run.
An expected failure (``xfail``) is not a skip and is left alone.

With pytest-xdist the controller sees every worker's reports (test reports,
and the skipped collection reports xdist forwards), so it decides; the
workers do not touch their exit status.
"""
from __future__ import annotations

import pytest

from tests.services import in_ci

_skipped: list[pytest.CollectReport | pytest.TestReport] = []


def _is_skip(report: pytest.CollectReport | pytest.TestReport) -> bool:
    return bool(report.skipped) and not hasattr(report, "wasxfail")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _is_skip(report):
        _skipped.append(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _is_skip(report):
        _skipped.append(report)


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:   # (path, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and in_ci() and not _is_worker(session.config) and session.exitstatus in (
            pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _skipped or not in_ci() or _is_worker(config):
        return
    terminalreporter.write_sep("=", f"CI=true: {len(_skipped)} skipped, which fails the run", red=True, bold=True)
    for report in _skipped:
        terminalreporter.write_line(f"SKIPPED {report.nodeid or report.fspath}: {_reason(report)}")
