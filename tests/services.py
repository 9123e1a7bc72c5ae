"""What a test does when a service or tool it needs is missing: skip on a laptop, fail in CI.

CI sets ``CI=true`` (``.ci/run`` exports it); there a missing RabbitMQ,
Prometheus or ``promtool`` is a failure whose message says how to get it, and
any other skip (``importorskip`` of Spark or pyarrow included) fails the run
too (tests/ci_skips.py), so the run can never go green without the tests that
need them.
"""
from __future__ import annotations

import os
import shutil
import socket

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str, how: str) -> None:
    """``what`` is not available: fail in CI, skip elsewhere; ``how`` says how to get it."""
    message = f"{what} is not available; {how}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service fails the run)", pytrace=False)
    pytest.skip(message)


def listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


#: Why a Spark or pyarrow test is skipped (``pytest.importorskip(..., reason=SPARK_EXTRA)``); in CI the skip fails
#: the run (tests/ci_skips.py).
SPARK_EXTRA = "the spark extra is not installed: pip install -e '.[spark]' (scripts/test.sh installs it)"

RABBITMQ_HOW = ("start RabbitMQ on 127.0.0.1:5672 (guest/guest): `rabbitmq-server -detached` "
                "(Debian: apt-get install rabbitmq-server)")


def require_rabbitmq() -> None:
    if not listening("127.0.0.1", 5672):
        missing("RabbitMQ on 127.0.0.1:5672", RABBITMQ_HOW)


def require_binary(binary: str, how: str) -> str:
    path = shutil.which(binary)
    if path is None:
        missing(f"{binary} (not on PATH)", how)
    return path
