"""Probes of Redis Cluster behaviour the design relies on (run by cluster_probe.sh)."""
import sys
import time

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

base = int(sys.argv[1])
rc = RedisCluster(host="127.0.0.1", port=base)


def node_of(key):
    return rc.get_node_from_key(key)


def raw(key):
    n = node_of(key)
    return redis.Redis(host=n.host, port=n.port)


def show(name, fn):
    try:
        print(f"{name}: {fn()!r}")
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {str(exc)[:90]}")


SCRIPT = "local n=0 for i=1,#KEYS do n=n+redis.call('LLEN', KEYS[i]) end return n"
# 1. kombu's plain names: a queue's priority lists sit on different slots
print("slots celery / celery\\x06\\x163:", key_slot(b"celery"), key_slot(b"celery\x06\x163"))
show("1a kombu _size pipeline (MULTI) over plain priority lists",
     lambda: rc.pipeline(transaction=True).llen("celery").llen("celery\x06\x163").execute())
show("1b transaction pipeline over one tag's lists",
     lambda: rc.pipeline(transaction=True).llen("{q:celery}").llen("{q:celery}\x06\x163").execute())
show("1c EVAL over one tag", lambda: rc.eval(SCRIPT, 2, "{q:a}", "{q:a}:inflight:c1"))
show("1d EVAL over two tags", lambda: rc.eval(SCRIPT, 2, "{q:a}", "{q:b}"))
show("1e BZPOPMIN over two tags (one node's raw connection)",
     lambda: raw("{q:a}").bzpopmin(["{q:a}:m", "{q:b}:m"], timeout=0.1))
# 2. classic pub/sub crosses the cluster bus; sharded pub/sub stays in its shard
a, b = raw("{q:a}"), None
for k in ("{q:b}", "{q:c}", "{q:d}", "{q:e}"):
    if node_of(k).port != node_of("{q:a}").port:
        b = raw(k)
        break
ps = b.pubsub()
ps.psubscribe("/0.celery.pidbox*")
ps.get_message(timeout=1)
print("2a PUBLISH on one master, receivers counted by it:", a.publish("/0.celery.pidbox", "ping"))
m = ps.get_message(timeout=2)
print("2b PSUBSCRIBE on another master got:", m and m["data"])
print("2c SPUBLISH (channel slot", key_slot(b"/0.celery.pidbox"), ") from its owner, receivers:",
      raw("/0.celery.pidbox").execute_command("SPUBLISH", "/0.celery.pidbox", "x"))
# 3. a slot migrating: a multi-key script with some keys missing
q = "{q:mig}"
slot = key_slot(q.encode())
src = node_of(q)
dst = next(n for n in rc.get_primaries() if n.port != src.port)
s, d = redis.Redis(host=src.host, port=src.port), redis.Redis(host=dst.host, port=dst.port)
s.lpush(q, "m1", "m2")   # the main list exists; its priority lists and in-flight hash do not
sid, did = s.execute_command("CLUSTER MYID"), d.execute_command("CLUSTER MYID")
d.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", sid)
s.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", did)
keys = [q, q + "\x06\x163", q + ":inflight:c1"]
show("3a source, script with one key present, two missing", lambda: s.eval(SCRIPT, 3, *keys))
show("3b source, single-key LPUSH to a missing priority list", lambda: s.lpush(q + "\x06\x163", "p"))
show("3c source, script whose keys all exist", lambda: s.eval(SCRIPT, 1, q))
s.execute_command("MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", q)
show("3d source after the list moved, script (no key present)", lambda: s.eval(SCRIPT, 3, *keys))


def asking(script_keys):
    p = d.pipeline(transaction=False)
    p.execute_command("ASKING")
    p.eval(SCRIPT, len(script_keys), *script_keys)
    return p.execute(raise_on_error=False)


show("3e target with ASKING, script with missing keys", lambda: asking(keys))
show("3f target with ASKING, script whose keys all exist", lambda: asking([q]))
show("3g redis-py RedisCluster.eval during migration (follows ASK/TRYAGAIN?)", lambda: rc.eval(SCRIPT, 3, *keys))
for n in rc.get_primaries():
    redis.Redis(host=n.host, port=n.port).execute_command("CLUSTER SETSLOT", slot, "NODE", did)
time.sleep(0.5)
show("3h after SETSLOT NODE, from the cluster client", lambda: rc.eval(SCRIPT, 3, *keys))
show("3i old owner, raw connection", lambda: s.eval(SCRIPT, 3, *keys))
