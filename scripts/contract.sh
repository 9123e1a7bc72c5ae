#!/usr/bin/env bash
# The version contract's CI diagonal (noxfile.py, docs/versions.md): the built wheel's contract suite on each
# Python and each Celery minor once, and the floor session (Python 3.10, celery 5.4.0, kombu 5.4.0,
# redis-py 5.0.0, billiard 4.2.0). One command from a fresh machine: installs nox and uv into .nox/tools when they
# are missing, then runs the sessions CONTRACT_JOBS at a time (default 2) and fails if any session failed.
#
#   scripts/contract.sh                      # the diagonal (what CI runs)
#   CONTRACT_SESSION=contract scripts/contract.sh   # the full grid
#   CONTRACT_LOGS=DIR ...                           # keep each job's nox log and report in DIR
#
# uv's cache lives in .nox/uv-cache (UV_CACHE_DIR to override): a fresh clone downloads what it needs, as CI
# does; a Python missing from PATH and pyenv is downloaded by uv. redis-server must be on PATH (scripts/test.sh
# installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

SESSION=${CONTRACT_SESSION:-contract_diagonal}
JOBS=${CONTRACT_JOBS:-2}
export UV_CACHE_DIR=${UV_CACHE_DIR:-$PWD/.nox/uv-cache}

if ! command -v nox >/dev/null 2>&1 || ! command -v uv >/dev/null 2>&1; then
    if [ ! -x .nox/tools/bin/nox ] || [ ! -x .nox/tools/bin/uv ]; then
        echo "nox or uv not found: installing them into .nox/tools" >&2
        "${PYTHON:-python3}" -m venv .nox/tools
        .nox/tools/bin/python -m pip install -q nox uv
    fi
    export PATH="$PWD/.nox/tools/bin:$PATH"
fi
if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server is not on PATH (scripts/test.sh installs it)" >&2
    exit 1
fi

mapfile -t sessions < <(nox -s "$SESSION" --list --json 2>/dev/null |
    python3 -c 'import json, sys; print("\n".join(s["session"] for s in json.load(sys.stdin)))')
if [ "${#sessions[@]}" -eq 0 ]; then
    echo "nox lists no $SESSION sessions" >&2
    exit 1
fi

logs=${CONTRACT_LOGS:-$(mktemp -d)}
mkdir -p "$logs"
started=$(date +%s)
pids=()
for ((job = 0; job < JOBS; job++)); do
    share=()
    for ((i = job; i < ${#sessions[@]}; i += JOBS)); do share+=("${sessions[i]}"); done
    [ "${#share[@]}" -eq 0 ] && continue
    nox --report "$logs/$job.json" -s "${share[@]}" >"$logs/$job.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
for log in "$logs"/*.log; do
    if [ "$status" -ne 0 ]; then cat "$log"; fi
done
echo "contract: ${#sessions[@]} $SESSION sessions, $JOBS at a time, in $(( $(date +%s) - started )) s"
grep -h -E "^nox > (Session .* (was successful|failed)|contract seconds)" "$logs"/*.log || true
[ -z "${CONTRACT_LOGS:-}" ] && rm -rf "$logs"
exit "$status"
