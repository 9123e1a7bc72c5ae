"""SIGKILL the master of {q:a} while publishing to it through RedisCluster: what a publisher sees."""
import os
import signal
import sys
import time

import redis
from redis.cluster import RedisCluster

base, tmp = int(sys.argv[1]), sys.argv[2]
t_wait = time.monotonic()
while not all(redis.Redis(port=p).info("replication").get("master_link_status", "up") == "up"
              for p in range(base, base + 6)):
    time.sleep(0.1)   # a replica that never synced refuses to fail over (cluster-replica-validity-factor)
print("every replica's link up %.1fs after start (repl-diskless-sync-delay 5 s by default)" % (time.monotonic() - t_wait))
rc = RedisCluster(host="127.0.0.1", port=base)
key = "{q:a}"
master = rc.get_node_from_key(key)
other = "{q:b}" if rc.get_node_from_key("{q:b}").port != master.port else "{q:c}"
print("master of", key, "port", master.port, "; a key elsewhere:", other, rc.get_node_from_key(other).port)
replica = next(p for p in range(base, base + 6)
               if redis.Redis(port=p).info("replication")["role"] == "slave")
sub = redis.Redis(host="127.0.0.1", port=replica).pubsub()
sub.psubscribe("/0.celery.pidbox*")
sub.get_message(timeout=1)
pushed, errors, first_error, recovered, other_ok = 0, {}, None, None, 0
t0 = time.monotonic()
killed = False
while time.monotonic() - t0 < 15:
    if not killed and time.monotonic() - t0 > 1:
        os.kill(int(open(f"{tmp}/{master.port}/pid").read()), signal.SIGKILL)
        killed, t_kill = True, time.monotonic()
    try:
        rc.lpush(key, "m")
        pushed += 1
        if killed and first_error is not None and recovered is None:
            recovered = time.monotonic() - t_kill
    except Exception as exc:
        name = type(exc).__name__
        errors[name] = errors.get(name, 0) + 1
        if first_error is None:
            first_error = time.monotonic() - t_kill
        time.sleep(0.05)
    try:
        rc.lpush(other, "m")
        other_ok += 1
    except Exception:
        pass
    if recovered is not None and time.monotonic() - t_kill > recovered + 1:
        break
print("pushes acknowledged", pushed, "errors by type", errors)
print("first error %.2fs after the kill; pushes worked again %.2fs after it" % (first_error or -1, recovered or -1))
print("pushes to the other master meanwhile:", other_ok)
alive = next(p for p in range(base, base + 6) if p != master.port)
print("CLUSTER NODES (from %d):" % alive)
for addr, node in redis.Redis(port=alive).execute_command("CLUSTER NODES").items():
    print("   ", addr, node["flags"], node["slots"])
print("redis-py's map still names port", rc.get_node_from_key(key).port, "for", key)
rc.nodes_manager.initialize()
print("after nodes_manager.initialize(): port", rc.get_node_from_key(key).port)
print("LLEN after failover:", rc.llen(key), "(acknowledged:", pushed, ")")
rc.publish("/0.celery.pidbox", "ping")
m = sub.get_message(timeout=2)
print("PUBLISH through the cluster client reached a PSUBSCRIBE on a replica:", m and m["data"])
