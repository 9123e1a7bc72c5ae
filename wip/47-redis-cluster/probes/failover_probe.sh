#!/bin/sh
# 3 masters + 3 replicas (cluster-node-timeout 2000) on $BASE..$BASE+5 in a temp dir; failover_probe.py
# SIGKILLs the master of {q:a} while LPUSHing through RedisCluster; then everything is stopped.
set -e
D=$(mktemp -d); BASE=${BASE:-17420}; PORTS=""
for i in 0 1 2 3 4 5; do p=$((BASE+i)); mkdir $D/$p; PORTS="$PORTS 127.0.0.1:$p"
  redis-server --port $p --cluster-enabled yes --cluster-config-file $D/$p/nodes.conf --dir $D/$p \
    --cluster-node-timeout 2000 --save '' --appendonly no --daemonize yes --pidfile $D/$p/pid \
    --logfile $D/$p/log; done
sleep 0.5
yes yes | redis-cli --cluster create $PORTS --cluster-replicas 1 >/dev/null
sleep 3
/work/main/.venv/bin/python "$(dirname "$0")/failover_probe.py" $BASE $D || true
grep -h -i "failover\|election\|rank\|too old\|sync" $D/*/log | grep -v "^$" | tail -n 25 || true
for i in 0 1 2 3 4 5; do kill $(cat $D/$((BASE+i))/pid) 2>/dev/null || true; done
sleep 0.5; rm -rf $D
