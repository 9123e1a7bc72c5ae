"""Redis memory per dead letter when the store keeps them (issue 48, design (b)): 10,000 letters of the
probes' ~1 kB body as kombu-style JSON in one list, used_memory before and after (own redis-server)."""
import json
import subprocess
import sys
import time

import redis
from replay_prototype import free_port, letter

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
port = free_port()
server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                          stdout=subprocess.DEVNULL)
try:
    time.sleep(0.3)
    r = redis.Redis(port=port)
    before = r.info("memory")["used_memory"]
    letters = [letter(i) for i in range(n)]
    r.lpush("DLQ.orders", *letters)
    after = r.info("memory")["used_memory"]
    print(json.dumps({"n": n, "letter_bytes": len(letters[0]), "bytes_per_letter": round((after - before) / n),
                      "redis": r.info("server")["redis_version"]}))
finally:
    server.terminate()
