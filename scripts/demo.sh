#!/usr/bin/env bash
# One command from a fresh machine to the end-to-end demo (examples/demo.py):
# creates .venv, installs the package with its dev extra, makes sure a
# redis-server binary exists (apt-get, as scripts/test.sh does), then runs a
# real Celery worker of the example shop against REDIS_URL when it is set,
# otherwise against a throwaway redis-server on a free port that the demo
# starts and stops itself. Extra arguments go to examples/demo.py (--timeout).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "installing celery-dlq and its dev extra into .venv ..." >&2
# pip's and setuptools' chatter goes to a log, shown only if the install fails.
if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[dev]'; } >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi

if [ -z "${REDIS_URL:-}" ] && ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing it with apt-get" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    # If this fails (no apt-get, no sudo), the demo falls back to fakeredis' TCP server.
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null; } \
        || echo "could not install redis-server; the demo will use an in-process fakeredis server" >&2
    # Debian starts a service on 6379 on install; the demo never uses it: it starts its own.
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
.venv/bin/python -m examples.demo "$@"
