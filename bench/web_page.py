"""Benchmark 8: the dashboard on a 100,000-letter DLQ while 50 new dead letters a second arrive (targets: p95 under
300 ms for every page, a filtered page's first screen under 500 ms).

Fills its own redis-server with ``DLQ.big``: 100,000 dead letters pushed by
the dead-letterer's own script (``lua/dead_letter.lua``, so the failure-group
index is what workers would have written), two tasks and three groups, one
letter in 500 a ``shop.refund``. A thread then keeps dead-lettering 50
letters a second into it (script and trend counters, as a worker does)
while whole HTTP GETs of ``create_app`` (uvicorn, basic auth, rendering,
the response read) are timed in interleaved rounds:

- the overview (DLQs, failure groups, trends, counters) and the groups page;
- the DLQ page, newest first;
- a dead letter's page from the link the DLQ page gave (its anchor), for a
  letter in the middle and for the newest, while letters keep arriving; and
  the same letters by an old-style page position (``?at=N``), stale after
  the first arrival (the case that read the DLQ in Python before);
- a filtered page's first screen: ``?task=shop.refund`` (1 in 500) and that
  group (``?group=<id>``).

Run: ``.venv/bin/python bench/web_page.py [--quick] [--rounds N]``.
"""
from __future__ import annotations

import os
import re
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

from bench import results as results_file  # noqa: E402
from bench.common import RedisServer, machine, parser, pct, redis_server_version, timed_call  # noqa: E402
from bench.replay import fill  # noqa: E402
from celery_dlq.fingerprint import group_id  # noqa: E402
from celery_dlq.storage import trends  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402
from celery_dlq.storage.scripts import Scripts  # noqa: E402
from celery_dlq.web import create_app  # noqa: E402
from tests.redis_server import free_port  # noqa: E402

TARGET_MS, FILTER_TARGET_MS = 300.0, 500.0
AUTH = ("bench", "bench-password")
RATE = 50.0


def fill_big(client: redis.Redis, depth: int) -> str:
    """``depth`` letters on ``DLQ.big`` in three groups; returns the refund group's id."""
    done = 0
    while done < depth:
        n = min(499, depth - done)
        fill(client, "big", n, "shop.charge", "'user_{}'" if done % 2 else "card {} declined", start=done)
        fill(client, "big", 1, "shop.refund", "refund {} failed", start=done + n)
        done += n + 1
    return group_id("shop.refund", "KeyError", "refund 1 failed")


class Arrivals(threading.Thread):
    """Dead-letters ``RATE`` letters a second into ``DLQ.big`` (script + trend counters) until stopped."""

    def __init__(self, url: str, start: int) -> None:
        super().__init__(daemon=True)
        self.client, self.next, self.stop = redis.Redis.from_url(url), start, threading.Event()
        self.keys, self.scripts = Keys("bench"), Scripts(self.client)

    def run(self) -> None:
        began = time.monotonic()
        while not self.stop.is_set():
            fill(self.client, "big", 1, "shop.charge", "'user_{}'", start=self.next)
            trends.count(self.client, self.scripts, self.keys, trends.series("dead_lettered", "big",
                                                                             "max_delivery_attempts"), 1, time.time())
            self.next += 1
            self.stop.wait(max(0.0, began + (self.next - self.started_at) / RATE - time.monotonic()))

    def begin(self) -> "Arrivals":
        self.started_at = self.next
        self.start()
        return self


def serve(app: Celery) -> tuple[uvicorn.Server, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(app, basic_auth=[":".join(AUTH)]), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def letter_link(html: str, which: int) -> str:
    links = re.findall(r'href="(/dlq/DLQ\.big/letters/[^"]+\?at=\d+:\d+)"', html)
    return links[which].replace("&amp;", "&")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--depth", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--settle", type=float, default=20.0, help="seconds of arrivals before the first timed GET")
    results_file.add_argument(p)
    args = p.parse_args()
    if args.quick:
        args.depth, args.rounds, args.settle = 20_000, 10, 5.0
    print(machine())
    server = RedisServer().start()
    web, arrivals = None, None
    try:
        client = redis.Redis.from_url(server.url)
        print(f"redis-server {redis_server_version(client)}; filling DLQ.big ({args.depth:,}) ...")
        refund = fill_big(client, args.depth)
        app = Celery("bench", broker=server.url, set_as_current=False)
        app.conf.update(task_default_queue="big", dlq_key_prefix="bench")
        web, url = serve(app)
        with httpx.Client(base_url=url, auth=AUTH, timeout=60) as http:
            newest_page = http.get("/dlq/DLQ.big").text
            middle_page = http.get(f"/dlq/DLQ.big?start={args.depth // 2}").text
            pages = {
                "overview": "/",
                "failure groups": "/groups",
                "DLQ page (newest first)": "/dlq/DLQ.big",
                "letter page, middle (its link's anchor)": letter_link(middle_page, 0),
                "letter page, newest (its link's anchor)": letter_link(newest_page, 0),
                "letter page, middle (stale ?at= position)": letter_link(middle_page, 0).split("?")[0]
                + f"?at={args.depth // 2}&order=newest",
                "letter page, newest (stale ?at= position)": letter_link(newest_page, 0).split("?")[0]
                + "?at=0&order=newest",
                "filtered first screen (task, 1 in 500)": "/dlq/DLQ.big?task=shop.refund",
                "filtered first screen (group)": f"/dlq/DLQ.big?group={refund}",
            }
            arrivals = Arrivals(server.url, args.depth + 10).begin()
            time.sleep(args.settle)   # the links above grow stale: a thousand letters arrive before the first GET
            times: dict[str, list[float]] = {name: [] for name in pages}
            load = [os.getloadavg()[0]]
            for round_ in range(args.rounds + 2):   # two warm-up rounds, not counted
                for name, path in pages.items():
                    response, elapsed = timed_call(lambda: http.get(path))
                    assert response.status_code == 200, (name, path, response.status_code, response.text[:300])
                    if round_ >= 2:
                        times[name].append(elapsed)
                load.append(os.getloadavg()[0])
            arrived = arrivals.next - arrivals.started_at   # since the links were taken
        arrivals.stop.set()
        print(f"\n{args.rounds} interleaved rounds after 2 warm-up rounds; {arrived:,} letters arrived meanwhile "
              f"(DLQ.big at {client.llen('DLQ.big'):,}); load average {min(load):.1f} to {max(load):.1f}\n")
        print("| page | p50 ms | p95 ms | max ms | target |\n|---|---|---|---|---|")
        for name, values in times.items():
            target = FILTER_TARGET_MS if name.startswith("filtered") else TARGET_MS
            p95 = pct(values, 95)
            print(f"| {name} | {statistics.median(values):.1f} | {p95:.1f} | {max(values):.1f} | "
                  f"{'met' if p95 < target else 'MISSED'} (p95 < {target:.0f}) |")
        figures: dict = {"depth": args.depth, "rounds": args.rounds}
        for name, values in times.items():
            key = "".join(c if c.isalnum() else "_" for c in name).strip("_")
            figures[f"p50_ms.{key}"] = round(statistics.median(values), 1)
            figures[f"p95_ms.{key}"] = round(pct(values, 95), 1)
        results_file.write(args.results, "web_page", figures, ["celery_dlq/web/", "celery_dlq/ops/",
                                                               "celery_dlq/storage/"], redis_server_version(client))
    finally:
        if arrivals is not None:
            arrivals.stop.set()
        if web is not None:
            web.should_exit = True
        server.stop()


if __name__ == "__main__":
    main()
