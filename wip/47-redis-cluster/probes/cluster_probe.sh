#!/bin/sh
# Start a throwaway 3-master cluster (no replicas) on free ports in a temp dir, run cluster_probe.py, stop it.
set -e
D=$(mktemp -d); BASE=${BASE:-17400}
for i in 0 1 2; do p=$((BASE+i)); mkdir $D/$p
  redis-server --port $p --cluster-enabled yes --cluster-config-file $D/$p/nodes.conf --dir $D/$p \
    --save '' --appendonly no --daemonize yes --pidfile $D/$p/pid --logfile $D/$p/log; done
sleep 0.5
yes yes | redis-cli --cluster create 127.0.0.1:$BASE 127.0.0.1:$((BASE+1)) 127.0.0.1:$((BASE+2)) >/dev/null
sleep 2
PYTHONPATH=${PYTHONPATH:-.} /work/main/.venv/bin/python "$(dirname "$0")/cluster_probe.py" $BASE || true
for i in 0 1 2; do kill $(cat $D/$((BASE+i))/pid); done
rm -rf $D
