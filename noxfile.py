"""The version contract: the built wheel on every supported Python x Celery/kombu x redis-py (docs/versions.md).

    nox -s contract            # the full grid (41 sessions: 40 and the floor)
    nox -s contract_diagonal   # what CI runs (scripts/contract.sh): 5 sessions, the floor one of them
    nox -s contract -- -x      # arguments after -- go to pytest

Each session installs THE BUILT WHEEL (built once per nox run with
``uv build``, never the checkout) with its pins and the test dependencies into
a uv virtualenv, copies ``tests/`` to the session's tmp dir and runs
``tests/contract`` and ``tests/unit/test_internals.py`` there, so the
checkout's ``celery_dlq/`` cannot shadow the installed one
(tests/contract/test_installed.py checks both the place and the pins). billiard and every other dependency are
left to the resolver, but in the floor session, which pins every floor (:data:`FLOOR`).
"""
from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
nox.options.default_venv_backend = "uv"
nox.options.sessions = ["contract_diagonal"]
nox.options.error_on_missing_interpreters = True

PYTHONS = ("3.10", "3.11", "3.12", "3.13")
#: The newest patch of each Celery minor we support, with the newest kombu of that minor.
CELERY = {"5.4": ("5.4.0", "5.4.2"), "5.5": ("5.5.3", "5.5.4"), "5.6": ("5.6.3", "5.6.2"), "5.7": ("5.7.0", "5.7.0")}
#: redis-py per Celery minor: our floor (``redis>=5.0``: 5.0.0) where celery[redis] and kombu[redis] admit it, and
#: the newest patch of every major they admit. What each declares (its wheel's METADATA, ``extra == "redis"``):
#:   celery 5.4.0  redis!=4.5.5,<6.0.0,>=4.5.2 (kombu 5.4.2: !=5.0.2,>=4.5.2) -> 5.0.0, 5.3.1 (no 6.x, 7.x, 8.x)
#:   kombu 5.5.4   redis!=4.5.5,!=5.0.2,<=5.2.1,>=4.5.2  -> 5.0.0, 5.2.1 (its cap; no 5.3, 6.x, 7.x, 8.x)
#:   kombu 5.6.2   redis!=4.5.5,!=5.0.2,<6.5,>=4.5.2     -> 5.0.0, 5.3.1, 6.4.0 (no 7.x, 8.x)
#:   kombu 5.7.0   redis<9.0.0,>=6.4.0                   -> 6.4.0, 7.4.1, 8.1.0 (no 5.x: our floor is below its)
#: (celery 5.5 to 5.7 take kombu[redis]'s range as theirs.)
REDIS = {"5.4": ("5.0.0", "5.3.1"), "5.5": ("5.0.0", "5.2.1"),
         "5.6": ("5.0.0", "5.3.1", "6.4.0"), "5.7": ("6.4.0", "7.4.1", "8.1.0")}
#: What the tests need beside the wheel (tests/conftest.py imports fakeredis; xdist registers the xdist_group mark).
TEST_DEPS = ("pytest>=8.0", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "fakeredis>=2.26")
#: The floor of everything installable with celery-dlq, in one session: our floors (Python 3.10, celery 5.4.0,
#: kombu 5.4.0, redis-py 5.0.0: pyproject.toml) and billiard's, which Celery declares (celery 5.4.0:
#: billiard>=4.2.0). Python, celery, kombu, redis, billiard.
FLOOR = ("3.10", "5.4.0", "5.4.0", "5.0.0", "4.2.0")


def _pyenv_on_path() -> None:
    """Put pyenv's interpreters (~/.pyenv/versions/3.X.Y/bin) on PATH, so that ``python=3.X`` finds them.

    Elsewhere nox asks uv, which downloads a missing interpreter (``--download-python auto``)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = []
    for minor in PYTHONS:
        builds = sorted(glob.glob(str(root / "versions" / f"{minor}.*" / "bin")),
                        key=lambda p: [int(x) for x in Path(p).parent.name.split(".") if x.isdigit()])
        if builds:
            found.append(builds[-1])
    if found:
        os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])


_pyenv_on_path()


def param(py: str, celery: str, kombu: str, redis: str, billiard: str = "") -> nox.param:
    """One session's pins; ``billiard`` empty: the resolver's choice."""
    pinned = f"-billiard{billiard}" if billiard else ""
    return nox.param(py, celery, kombu, redis, billiard, id=f"py{py}-celery{celery}-kombu{kombu}-redis{redis}{pinned}")


def floor() -> nox.param:
    return param(*FLOOR)


def grid() -> list[nox.param]:
    """Every Python x the newest Celery/kombu of each minor x redis-py, and the floor session."""
    return [param(py, celery, kombu, redis)
            for py in PYTHONS for minor, (celery, kombu) in CELERY.items() for redis in REDIS[minor]] + [floor()]


def diagonal() -> list[nox.param]:
    """Each Python once, each Celery minor once (the newest redis-py it admits), and the floor session
    (:data:`FLOOR`): Python 3.11 takes the newest Celery, the main suite's own versions."""
    rows = [("3.10", "5.4"), ("3.11", "5.7"), ("3.12", "5.5"), ("3.13", "5.6")]
    return [param(py, *CELERY[minor], REDIS[minor][-1]) for py, minor in rows] + [floor()]


_wheel: Path | None = None


def built_wheel(session: nox.Session) -> Path:
    """The wheel of the checkout, built once per nox run into a temporary directory."""
    global _wheel
    if _wheel is None or not _wheel.exists():
        out = Path(tempfile.mkdtemp(prefix="celery-dlq-wheel-"))
        session.run("uv", "build", "--wheel", "--quiet", "--out-dir", str(out), str(ROOT), external=True)
        _wheel = next(out.glob("celery_dlq-*.whl"))
    return _wheel


def run_contract(session: nox.Session, celery: str, kombu: str, redis: str, billiard: str) -> None:
    started = time.monotonic()
    try:
        _run_contract(session, celery, kombu, redis, billiard)
    finally:   # docs/versions.md's seconds per session: the install included, the wheel's build not
        session.log(f"contract seconds: {time.monotonic() - started:.0f}")


def _run_contract(session: nox.Session, celery: str, kombu: str, redis: str, billiard: str) -> None:
    wheel = built_wheel(session)
    pins = (f"celery=={celery}", f"kombu=={kombu}", f"redis=={redis}", *([f"billiard=={billiard}"] if billiard else []))
    # --reinstall-package: a reused venv already has a celery-dlq of the same version (the previous wheel).
    session.install("--reinstall-package", "celery-dlq", f"celery-dlq[web] @ {wheel.as_uri()}", *pins, *TEST_DEPS)
    session.run("python", "-c", "import sys, celery, kombu, billiard, redis; print('versions: python', "
                "sys.version.split()[0], 'celery', celery.__version__, 'kombu', kombu.__version__, "
                "'billiard', billiard.__version__, 'redis', redis.__version__)")
    # tests/ (and the pytest configuration) away from the checkout: its celery_dlq/ is not importable there.
    work = Path(session.create_tmp()) / "run"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__", "projects"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    session.chdir(work)
    env = {"CELERY_DLQ_CONTRACT_PINS": " ".join(pins), "CELERY_DLQ_CONTRACT_CHECKOUT": str(ROOT),
           "PYTHONPATH": ""}
    # The contract suite, and the check of every library internal celery-dlq relies on (celery_dlq.internals)
    # on these versions; less the one test that reads docs/internals.md, which is not copied.
    session.run("python", "-m", "pytest", "tests/contract", "tests/unit/test_internals.py",
                "--deselect", "tests/unit/test_internals.py::test_docs_internals_names_every_internal",
                "-p", "no:cacheprovider", "-q", "-rA", "--timeout", "240", *session.posargs, env=env)


@nox.session(name="contract")
@nox.parametrize("python,celery,kombu,redis,billiard", grid())
def contract(session: nox.Session, celery: str, kombu: str, redis: str, billiard: str) -> None:
    """The full grid: every Python x Celery/kombu minor x redis-py major kombu[redis] admits, and the floor."""
    run_contract(session, celery, kombu, redis, billiard)


@nox.session(name="contract_diagonal")
@nox.parametrize("python,celery,kombu,redis,billiard", diagonal())
def contract_diagonal(session: nox.Session, celery: str, kombu: str, redis: str, billiard: str) -> None:
    """CI's diagonal of the grid (scripts/contract.sh)."""
    run_contract(session, celery, kombu, redis, billiard)
