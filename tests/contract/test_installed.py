"""What the contract suite runs against: the installed package and the versions around it.

Under ``nox -s contract`` (``CELERY_DLQ_CONTRACT_PINS`` set), celery-dlq must
be the built wheel in the session's site-packages, never the checkout, and
the versions installed must be the session's pins.
"""
from __future__ import annotations

import os
import sysconfig
from importlib.metadata import version
from pathlib import Path

import pytest

import celery_dlq

pytestmark = pytest.mark.contract

LIBRARIES = ("celery", "kombu", "billiard", "redis")


def test_the_installed_package_and_the_library_versions():
    versions = {name: version(name) for name in ("celery-dlq", *LIBRARIES)}
    print("\ncontract versions:", " ".join(f"{k}=={v}" for k, v in versions.items()), f"at {celery_dlq.__file__}")
    pins = os.environ.get("CELERY_DLQ_CONTRACT_PINS")
    if not pins:
        return                  # the normal suite: the editable checkout on the development versions
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    where = Path(celery_dlq.__file__).resolve()
    assert where.is_relative_to(site), f"celery_dlq imported from {where}, not from the wheel in {site}"
    checkout = os.environ.get("CELERY_DLQ_CONTRACT_CHECKOUT")
    assert not checkout or not where.is_relative_to(Path(checkout, "celery_dlq").resolve())
    for pin in pins.split():
        name, _, wanted = pin.partition("==")
        assert version(name) == wanted, f"{name} {version(name)} installed, the session pins {wanted}"
