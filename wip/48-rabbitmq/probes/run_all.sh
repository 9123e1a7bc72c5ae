#!/bin/sh
# Run every probe once (rates: three times) and keep their output in results/, with the load they ran under.
# Needs the RabbitMQ on 127.0.0.1:5672 (guest/guest) and redis-server on PATH.
set -e
cd "$(dirname "$0")"
PY=${PY:-/work/main/.venv/bin/python}
mkdir -p results
{ date -u; uptime; git rev-parse --short HEAD; } > results/when.txt
$PY requeue_browse.py 10000 > results/requeue_browse.json
for i in 1 2 3; do $PY stream_browse.py 2000; done > results/stream_browse.jsonl
for i in 1 2 3; do $PY publish_confirm.py 2000; done > results/publish_confirm.jsonl
$PY replay_prototype.py 10000 > results/replay_prototype.json
$PY depth_while_browsing.py > results/depth_while_browsing.json
$PY store_memory.py 10000 > results/store_memory.json
uptime >> results/when.txt
