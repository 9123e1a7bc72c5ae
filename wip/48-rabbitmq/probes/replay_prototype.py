"""A prototype of the chosen replay (issue 48): letters in Redis, delivered to RabbitMQ with confirms,
SIGKILLed mid-way and run again; then a worker-side drop of second copies by replay id.

Not the implementation: raw redis-py and py-amqp, one list, no groups, no archive. It measures
(1) letters/s of claim (Lua) -> publish (pipelined confirms, mandatory) -> settle (Lua), and
(2) after a SIGKILL, how many letters were in doubt, how many reached the queue twice, and that a
SET NX on the replay id at first delivery leaves each letter run exactly once.

    python replay_prototype.py 10000        # starts its own redis-server on a free port
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import amqp
import redis
from common import BODY, connect, name

CLAIM = """
-- KEYS[1] = dlq (LIST), KEYS[2] = claims (HASH: replay id -> the message to publish)
-- ARGV: raw letter, replay id, message ... ; returns 1 (claimed) or 0 (gone) per letter
local out = {}
for i = 1, #ARGV, 3 do
  if redis.call('LREM', KEYS[1], -1, ARGV[i]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[i + 1], ARGV[i + 2]); out[#out + 1] = 1
  else out[#out + 1] = 0 end
end
return out
"""
SETTLE = "return redis.call('HDEL', KEYS[1], unpack(ARGV))"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def letter(i: int) -> bytes:
    return json.dumps({"body": BODY.decode(), "content-type": "application/json", "content-encoding": "utf-8",
                       "headers": {"id": f"task-{i}", "task": "proj.fails", "x-dlq-reason": "max_delivery_attempts",
                                   "x-dlq-original-queue": "target"},
                       "properties": {"priority": 0, "delivery_tag": str(uuid.uuid4())}}).encode()


def run(port: int, queue: str, window: int) -> None:
    """The replay: resume in-doubt claims first, then claim, publish, settle a window at a time."""
    r = redis.Redis(port=port)
    claim, settle = r.register_script(CLAIM), r.register_script(SETTLE)
    conn = connect()
    ch = conn.channel()
    ch.confirm_select()
    acked, returned = [0], []
    ch.events["basic_ack"].add(lambda tag, multiple: acked.__setitem__(0, max(acked[0], tag)))
    ch.events["basic_return"].add(lambda *a: returned.append(a))
    sent = 0

    def deliver(batch: list[tuple[bytes, bytes]]) -> None:
        nonlocal sent
        for _rid, message in batch:
            doc = json.loads(message)
            ch._basic_publish(amqp.Message(doc["body"].encode(), content_type=doc["content-type"],
                                           application_headers=doc["headers"], delivery_mode=2,
                                           priority=doc["properties"]["priority"]),
                              exchange="", routing_key=queue, mandatory=True)
            sent += 1
        while acked[0] < sent:
            conn.drain_events(timeout=10)
        assert not returned, returned
        settle(keys=["claims"], args=[rid for rid, _ in batch])

    in_doubt = list(r.hgetall("claims").items())            # a run killed before: publish them again
    for start in range(0, len(in_doubt), window):
        deliver(in_doubt[start:start + window])
    while raws := r.lrange("dlq", -window, -1)[::-1]:      # oldest first
        args, prepared = [], []
        for raw in raws:
            doc = json.loads(raw)
            rid = uuid.uuid4().hex
            doc["headers"]["x-dlq-replay-id"] = rid
            message = json.dumps(doc)
            args += [raw, rid, message]
            prepared.append((rid.encode(), message.encode()))
        ok = claim(keys=["dlq", "claims"], args=args)
        deliver([p for p, k in zip(prepared, ok) if k])
    conn.close()


def drain(queue: str) -> list:
    conn = connect()
    ch = conn.channel()
    out = []
    while (m := ch.basic_get(queue=queue, no_ack=True)) is not None:
        out.append(m.headers["x-dlq-replay-id"])
    conn.close()
    return out


def killed(port: int, r, queue: str, n: int, window: int, delay: float) -> dict:
    """One replay of ``n`` letters SIGKILLed ``delay`` s after half of them were claimed, then run again."""
    r.lpush("dlq", *[letter(i) for i in range(n)])
    child = subprocess.Popen([sys.executable, __file__, "run", str(port), queue, str(window)])
    while r.llen("dlq") > n // 2:
        time.sleep(0.002)
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    out = {"delay_s": delay, "left_in_dlq_at_kill": r.llen("dlq"), "in_doubt_at_kill": r.hlen("claims")}
    run(port, queue, window)
    ids = drain(queue)
    out["in_queue_after_rerun"] = len(ids)
    out["distinct_replay_ids"] = len(set(ids))
    out["run_after_drop_by_replay_id"] = sum(1 for rid in ids if r.set(f"replay:{rid}", 1, nx=True, ex=3600))
    out["left_in_dlq_and_claims"] = [r.llen("dlq"), r.hlen("claims")]
    r.delete(*(r.keys("replay:*") or ["none"]))
    return out


def main(n: int, window: int = 500) -> dict:
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        r = redis.Redis(port=port)
        queue = name("replay")
        conn = connect()
        conn.channel().queue_declare(queue, durable=True, auto_delete=False)
        out: dict = {"n": n, "window": window}
        # (1) an uninterrupted replay
        r.lpush("dlq", *[letter(i) for i in range(n)])
        started = time.perf_counter()
        run(port, queue, window)
        out["uninterrupted_letters_per_s"] = round(n / (time.perf_counter() - started))
        out["uninterrupted_in_queue"] = len(drain(queue))
        # (2) SIGKILLed mid-way at different moments, then run again
        out["killed"] = [killed(port, r, queue, n, window, delay) for delay in (0.0, 0.003, 0.007, 0.011, 0.02)]
        conn.channel().queue_delete(queue)
        conn.close()
        return out
    finally:
        server.terminate()


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 500)))
