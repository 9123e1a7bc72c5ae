"""Benchmark 8: the dashboard's DLQ page on a 100,000-letter DLQ (target: median < 300 ms).

A page must cost O(page), never O(DLQ depth): the window reads one LRANGE
from the end it shows. This fills its own redis-server with ``DLQ.big``
(100,000 dead letters of two tasks) and ``DLQ.small`` (100), serves
``create_app`` with uvicorn on a free port in this process, and times whole
HTTP GETs (basic auth, template rendering, the response read) in
interleaved rounds, the two DLQs side by side:

- the DLQ page, newest first (the default view) and oldest first, 50 a page;
- a page deep inside (``start=50,000``);
- a dead letter's page (with the position hint its link carries);
- a filter that matches one letter in 500 (each page reads until 50 match, at
  most 10,000 letters: the cost of a filter is bounded per page).

Run: ``.venv/bin/python bench/web_page.py [--quick] [--rounds N]``.
"""
from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import redis  # noqa: E402
import uvicorn  # noqa: E402
from celery import Celery  # noqa: E402

from bench.common import RedisServer, machine, parser, redis_server_version, timed_call  # noqa: E402
from celery_dlq import headers as H  # noqa: E402
from celery_dlq.web import create_app  # noqa: E402
from tests.redis_server import free_port  # noqa: E402

TARGET_MS = 300.0
AUTH = ("bench", "bench-password")


def letter(queue: str, task_id: str, task: str, n: int) -> str:
    headers = H.dead_letter_headers({"id": task_id, "task": task, "lang": "py", "argsrepr": f"({n},)"},
                                    delivery=3, queue=queue, exchange="", routing_key=queue,
                                    reason="max_delivery_attempts",
                                    failure={"type": "ValueError", "message": f"card declined {n}",
                                             "traceback": "Traceback (most recent call last):\n ..."},
                                    worker="w1@bench", now=time.time() - 3600 + n / 1000)
    return json.dumps({"body": "W1sxXSwge30sIHt9XQ==", "content-encoding": "utf-8",
                       "content-type": "application/json", "headers": headers,
                       "properties": {"correlation_id": task_id, "body_encoding": "base64", "priority": 0,
                                      "delivery_tag": task_id}})


def fill(client: redis.Redis, queue: str, depth: int) -> None:
    """``depth`` dead letters on ``DLQ.<queue>``: one in 500 is ``shop.refund``, the rest ``shop.charge``."""
    pipe = client.pipeline(transaction=False)
    for start in range(0, depth, 1000):
        batch = [letter(queue, f"{queue}-{i:08d}", "shop.refund" if i % 500 == 7 else "shop.charge", i)
                 for i in range(start, min(start + 1000, depth))]
        pipe.lpush(f"DLQ.{queue}", *batch)
        if len(pipe) >= 20:
            pipe.execute()
    pipe.execute()


def serve(app: Celery) -> tuple[uvicorn.Server, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(app, basic_auth=[":".join(AUTH)]), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def pages(depth: int) -> dict[str, str]:
    return {
        "DLQ page, newest first": "",
        "DLQ page, oldest first": "?order=oldest",
        "page in the middle (start=depth/2)": "?start={mid}",
        "a dead letter's page": "/letters/{id}?at=10",
        "filter matching 1 in 500": "?task=shop.refund",
    }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--depth", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    if args.quick:
        args.depth, args.rounds = 20_000, 7
    print(machine())
    server = RedisServer().start()
    web = None
    try:
        client = redis.Redis.from_url(server.url)
        print(f"redis-server {redis_server_version(client)}; filling DLQ.big ({args.depth:,}) and DLQ.small (100)...")
        fill(client, "big", args.depth)
        fill(client, "small", 100)
        app = Celery("bench", broker=server.url, set_as_current=False)
        app.conf.update(task_default_queue="big", dlq_key_prefix="bench")
        web, url = serve(app)
        sides = {"small": 100, "big": args.depth}
        times: dict[tuple[str, str], list[float]] = {}
        with httpx.Client(base_url=url, auth=AUTH, timeout=30) as http:
            ids = {side: f"{side}-{n - 11:08d}" for side, n in sides.items()}  # the letter at newest-first 10
            for _ in range(args.rounds + 2):  # two warm-up rounds, not counted
                for name, path in pages(args.depth).items():
                    for side in sides:
                        target = f"/dlq/DLQ.{side}" + path.replace("{id}", ids[side]).replace(
                            "{mid}", str(sides[side] // 2))
                        response, elapsed = timed_call(lambda: http.get(target))
                        assert response.status_code == 200, (name, side, response.status_code)
                        assert ('id="task-id"' if "letters/" in path else 'class="letter"') in response.text
                        times.setdefault((name, side), []).append(elapsed)
        print(f"\nmedian of {args.rounds} interleaved rounds (after 2 warm-up rounds), whole HTTP GET; "
              f"target for the DLQ page: < {TARGET_MS:.0f} ms\n")
        print(f"| page | DLQ of 100: ms | DLQ of {args.depth:,}: ms | ratio | target |\n|---|---|---|---|---|")
        for name in pages(args.depth):
            small, big = (statistics.median(times[(name, side)][2:]) for side in sides)
            verdict = ("met" if big < TARGET_MS else "MISSED") if name.startswith("DLQ page") else "-"
            print(f"| {name} | {small:.1f} | {big:.1f} | {big / small:.2f} | {verdict} |")
    finally:
        if web is not None:
            web.should_exit = True
        server.stop()


if __name__ == "__main__":
    main()
