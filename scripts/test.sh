#!/usr/bin/env bash
# One command from a fresh machine to a full test run:
# creates .venv, installs the package with its dev and spark extras, makes
# sure a redis-server binary exists (the integration tests start their own on
# a free port) and Java 17 (PySpark's JVM), then runs pytest. Extra arguments
# go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev,spark,docs]'

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing it with apt-get" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
    # Debian starts a service on install; our tests start their own servers.
fi

if ! command -v redis-cli >/dev/null 2>&1; then
    echo "redis-cli not found: installing redis-tools with apt-get (the Redis Cluster test creates its cluster with it)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-tools >/dev/null
fi

if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found: installing Debian's prometheus package with apt-get (the alert rule tests)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    # No recommends (node-exporter); Debian may start a prometheus service on install: our tests start their own.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "chromium/chromedriver not found: installing Debian's chromium chromium-driver with apt-get (the dashboard's browser test)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi

if ! command -v java >/dev/null 2>&1; then
    echo "java not found: installing openjdk-17-jre-headless with apt-get (PySpark needs it)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

# RabbitMQ on 127.0.0.1:5672 (guest/guest) for the cross-broker tests. In CI (CI=true) it is a service the
# machine provides: missing, the run fails here, naming it. Elsewhere it is started (installed with apt-get when
# absent) if nothing listens there; if it cannot be had, those tests skip and say why.
RABBITMQ_HOW="start it with: rabbitmq-server -detached (Debian: apt-get install rabbitmq-server)"
if ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
    case "${CI:-}" in
        1|true|TRUE|True|yes)
            echo "CI: RabbitMQ is not listening on 127.0.0.1:5672 (guest/guest), which the RabbitMQ tests need; $RABBITMQ_HOW" >&2
            exit 1 ;;
    esac
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        echo "rabbitmq-server not found: installing it with apt-get (the RabbitMQ tests)" >&2
        { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq rabbitmq-server; } >/dev/null 2>&1 \
            || echo "could not install rabbitmq-server: the RabbitMQ tests will skip" >&2
    fi
    if command -v rabbitmq-server >/dev/null 2>&1; then
        $SUDO rabbitmq-server -detached >/dev/null 2>&1 || echo "rabbitmq-server did not start: the RabbitMQ tests will skip" >&2
        for _ in $(seq 60); do (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && break; sleep 1; done
    fi
fi

# Import layering (pyproject.toml [tool.importlinter]); tests/unit/test_layers.py checks it too.
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
# Lint and import order, then types (pyproject.toml [tool.ruff], [tool.mypy]).
.venv/bin/ruff check celery_dlq
.venv/bin/mypy

# Two pytest-xdist workers (tests/conftest.py keeps the Spark tests on one and
# starts the slow ones first); PYTEST_WORKERS=0 runs in one process.
# A full run leaves tests/contract to the diagonal below, which runs it on this venv's versions (Python 3.11,
# the newest Celery and redis-py) among others: not twice.
IGNORE=()
if [ "$#" -eq 0 ] && [ "${CONTRACT:-1}" != 0 ]; then
    IGNORE=(--ignore=tests/contract)
fi
set +e
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=30 "${IGNORE[@]}" "$@"
rc=$?
set -e
if [ "$rc" -ne 0 ] || [ "$#" -gt 0 ] || [ "${CONTRACT:-1}" = 0 ]; then
    exit "$rc"
fi

# The version matrix's CI diagonal (noxfile.py, docs/versions.md): the built wheel's contract suite on every
# supported Celery minor and Python. Run after a full pytest run only (extra pytest arguments or CONTRACT=0
# skip it).
exec bash scripts/contract.sh
