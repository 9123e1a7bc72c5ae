"""The exporter end to end: the real `celery ... dlq exporter` process scraped over HTTP, real redis-servers,
a real prefork worker, promtool on the alert rules, and a real Prometheus server whose alert fires.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from celery_dlq import headers as H
from celery_dlq.storage.keys import Keys, QueueLists
from tests.integration.conftest import ROOT
from tests.processes import ServerProcess, wait_for
from tests.redis_server import RedisServer
from tests.services import require_binary

pytestmark = pytest.mark.integration

MONITORING = ROOT / "examples" / "monitoring"
RULES = MONITORING / "celery-dlq.rules.yml"


def get(url: str, timeout: float = 10, **headers: str) -> tuple[str, str]:
    """``(content type, body)`` of a GET."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
        return response.headers["Content-Type"], response.read().decode()


class ExporterProcess(ServerProcess):
    """``celery -A tests.integration.ops_app dlq exporter --port <free>``, as an operator starts it."""

    def __init__(self, env: dict, log: Path) -> None:
        super().__init__(lambda port: [sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq",
                                       "exporter", "--port", str(port)],
                         env, log, ready="/metrics", what="the exporter")
        self.url = f"{self.base}/metrics"

    def text(self) -> str:
        self.alive()
        return get(self.url)[1]

    def scrape(self) -> dict[tuple[str, tuple], float]:
        """``(sample name, sorted labels) -> value``, as Prometheus reads it."""
        samples = {}
        for family in text_string_to_metric_families(self.text()):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples



def ops_env(broker: str, queue: str, prefix: str) -> dict:
    return {**os.environ, "DLQ_TEST_BROKER": broker, "DLQ_TEST_QUEUE": queue, "DLQ_TEST_PREFIX": prefix,
            "PYTHONPATH": str(ROOT)}


def dlq_cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", *args],
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def push_letters(client: redis.Redis, queue: str, n: int, at: float) -> None:
    """``n`` small dead letters on DLQ.<queue>, as kombu's Redis transport stores them."""
    for _ in range(n):
        task_id = str(uuid.uuid4())
        headers = H.dead_letter_headers({"id": task_id, "task": "proj.noop"}, delivery=3, queue=queue, exchange="",
                                        routing_key=queue, failure={"type": "ValueError", "message": "boom"},
                                        reason="max_delivery_attempts", worker="w1@test", now=at)
        client.lpush(f"DLQ.{queue}", json.dumps({
            "body": "W1swXSwge30sIHt9XQ==", "content-encoding": "utf-8", "content-type": "application/json",
            "headers": headers, "properties": {"correlation_id": task_id, "body_encoding": "base64",
                                               "delivery_tag": str(uuid.uuid4()), "priority": 0}}))


@pytest.fixture
def exporters():
    started: list[ExporterProcess] = []
    yield started
    for exporter in started:
        exporter.stop()


# -- a real worker's failures, read over HTTP ----------------------------------------

def run_the_mix(harness) -> dict[str, list]:
    """Two tasks dead-lettered after 3 deliveries, one at once (non-retryable), three parked for an hour."""
    harness.worker()
    sent = {"always_fails": [harness.send("proj.always_fails", args=(i,)) for i in range(2)],
            "not_retryable": [harness.send("proj.not_retryable")],
            "park_long": [harness.send("proj.park_long", args=(i,)) for i in range(3)]}
    keys = Keys(harness.prefix)
    harness.wait_until(lambda: len(harness.dead_letters()) == 3 and harness.redis.zcard(keys.delayed) == 3,
                       timeout=60, message="3 dead letters and 3 parked retries")
    return sent


def test_metrics_over_http_equal_what_redis_holds(harness, exporters):
    run_the_mix(harness)
    env = ops_env(harness.broker, harness.queue, harness.prefix)
    exporter = ExporterProcess(env, harness.tmp_path / "exporter.log").start()
    exporters.append(exporter)
    dlq, queue, r = f"DLQ.{harness.queue}", harness.queue, harness.redis
    got = exporter.scrape()
    oldest = min(letter["headers"][H.DEAD_LETTERED_AT] for letter in harness.dead_letters())
    assert got[("celery_dlq_dead_letters", (("dlq", dlq), ("queue", queue)))] == 3 == \
        sum(r.llen(key) for key in QueueLists().keys(dlq))
    assert got[("celery_dlq_parked", (("queue", queue),))] == 3 == r.zcard(Keys(harness.prefix).delayed)
    assert abs(got[("celery_dlq_oldest_dead_letter_age_seconds", (("dlq", dlq),))] - (time.time() - oldest)) < 5
    assert got[("celery_dlq_overdue_parked", (("queue", queue),))] == 0
    assert got[("celery_dlq_redis_up", ())] == 1

    purge = dlq_cli(env, "purge", queue, "--task", "proj.not_retryable", "--force")
    assert purge.returncode == 0, purge.stderr
    replay = dlq_cli(env, "replay", queue, "--all", "--to", f"{queue}.hold")   # a queue no worker consumes
    assert replay.returncode == 0, replay.stderr
    got = exporter.scrape()
    assert got[("celery_dlq_dead_letters", (("dlq", dlq), ("queue", queue)))] == 0
    assert got[("celery_dlq_purged_total", (("dlq", dlq),))] == 1
    assert got[("celery_dlq_replayed_total", (("dlq", dlq),))] == 2
    assert not [key for key in got if key[0] == "celery_dlq_oldest_dead_letter_age_seconds" and ("dlq", dlq) in key[1]]
    stats = {k.decode(): int(v) for k, v in r.hgetall(Keys(harness.prefix).stats).items()}
    assert (stats["purged"], stats["replayed"]) == (1, 2)
    assert exporter.stop() == 0


def test_the_workers_counters_reach_the_exporter(harness, exporters):
    sent = run_the_mix(harness)
    exporter = ExporterProcess(ops_env(harness.broker, harness.queue, harness.prefix),
                               harness.tmp_path / "exporter.log").start()
    exporters.append(exporter)
    deliveries = {name: sum(len(harness.deliveries(result.id)) for result in results)
                  for name, results in sent.items()}
    assert deliveries["always_fails"] == 6
    q = harness.queue
    redelivered = ("celery_dlq_redelivered_total", (("queue", q), ("task", "proj.always_fails")))
    # A redelivery a fetch moved itself is counted when the worker's flush timer next writes its tally.
    harness.wait_until(lambda: exporter.scrape().get(redelivered) == 4, timeout=15, message="4 redelivered")
    got = exporter.scrape()
    assert got[("celery_dlq_parked_total", (("queue", q), ("task", "proj.always_fails")))] == 4
    assert got[("celery_dlq_parked_total", (("queue", q), ("task", "proj.park_long")))] == 3
    assert got[("celery_dlq_dead_lettered_total", (("queue", q), ("reason", "max_delivery_attempts"),
                                                   ("task", "proj.always_fails")))] == 2
    assert got[("celery_dlq_dead_lettered_total", (("queue", q), ("reason", "non_retryable"),
                                                   ("task", "proj.not_retryable")))] == 1


# -- Redis goes away and comes back ----------------------------------------------------

ACL = ("--user", "ops", "on", ">secret", "~*", "&*", "+@all")   # the exporter logs in with a password


def test_redis_stopped_gives_redis_up_0_and_the_exporter_recovers(tmp_path, unique, exporters):
    server = RedisServer(None, *ACL).start()
    try:
        url = f"redis://ops:secret@127.0.0.1:{server.port}/0"
        queue = f"q{unique}"
        push_letters(redis.Redis.from_url(url), queue, 4, at=time.time() - 60)
        log = tmp_path / "exporter.log"
        exporter = ExporterProcess(ops_env(url, queue, f"p{unique}"), log).start()
        exporters.append(exporter)
        got = exporter.scrape()
        assert got[("celery_dlq_redis_up", ())] == 1, log.read_text()
        assert got[("celery_dlq_dead_letters", (("dlq", f"DLQ.{queue}"), ("queue", queue)))] == 4

        server.stop()
        for _ in range(3):
            text = exporter.text()
            assert [line for line in text.splitlines() if not line.startswith("#")] == ["celery_dlq_redis_up 0.0"]

        server = RedisServer(server.port, *ACL).start()   # the same port, empty
        push_letters(redis.Redis.from_url(url), queue, 2, at=time.time() - 5)
        got = exporter.scrape()
        assert got[("celery_dlq_redis_up", ())] == 1
        assert got[("celery_dlq_dead_letters", (("dlq", f"DLQ.{queue}"), ("queue", queue)))] == 2
        assert exporter.stop() == 0
        logged = log.read_text()
        assert f"reading Redis at redis://ops:**@127.0.0.1:{server.port}/0" in logged
        assert "cannot read Redis" in logged and "can be read again" in logged
        assert "secret" not in logged
    finally:
        server.stop()


def test_a_scraper_asking_for_openmetrics_gets_the_classic_text_format(tmp_path, redis_server, unique, exporters):
    """In OpenMetrics the counter celery_dlq_parked_total would be a second family named celery_dlq_parked."""
    exporter = ExporterProcess(ops_env(redis_server.url, f"q{unique}", f"p{unique}"), tmp_path / "e.log").start()
    exporters.append(exporter)
    content_type, text = get(exporter.url, Accept="application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "# TYPE celery_dlq_parked gauge" in text and "# TYPE celery_dlq_parked_total counter" in text


# -- the alert rules: promtool, and a real Prometheus ------------------------------------

def needs(binary: str) -> str:
    return require_binary(binary, "scripts/test.sh installs Debian's prometheus package (apt-get install prometheus)")


def test_promtool_checks_and_unit_tests_the_rules():
    promtool = needs("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS: 6 rules found" in check.stdout, check.stdout + check.stderr
    tested = subprocess.run([promtool, "test", "rules", "celery-dlq.rules.test.yml"], cwd=MONITORING,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def fast_rules(path: Path) -> Path:
    """The example rules with every ``for:`` at 0s and 15-minute windows at 20 s, for a test that cannot wait."""
    text, fors = re.subn(r"for: \d+[smh]", "for: 0s", RULES.read_text())
    text, windows = re.subn(r"(\[|offset )15m", r"\g<1>20s", text)
    assert (fors, windows) == (5, 4), (fors, windows)
    path.write_text(text)
    return path


class Prometheus(ServerProcess):
    """A real ``prometheus`` server scraping one exporter every second, evaluating the rules every second."""

    def __init__(self, tmp_path: Path, target: str, rules: Path) -> None:
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({   # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "celery-dlq", "static_configs": [{"targets": [target]}]}],
        }))
        binary = needs("prometheus")
        super().__init__(lambda port: [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"],
                         dict(os.environ), tmp_path / "prometheus.log", ready="/-/ready", what="Prometheus",
                         timeout=60)
        self.api = f"{self.base}/api/v1"
        self.start()

    def query(self, expr: str) -> list:
        try:
            return json.loads(get(f"{self.api}/query?{urllib.parse.urlencode({'query': expr})}")[1])["data"]["result"]
        except (urllib.error.URLError, ConnectionError):
            self.alive()
            return []

    def firing(self, name: str, **labels: str) -> list:
        try:
            alerts = json.loads(get(f"{self.api}/alerts")[1])["data"]["alerts"]
        except (urllib.error.URLError, ConnectionError):
            return []
        return [a for a in alerts if a["labels"].get("alertname") == name and a["state"] == "firing"
                and all(a["labels"].get(k) == v for k, v in labels.items())]



def test_a_real_prometheus_fires_the_example_alerts(tmp_path, unique, exporters):
    needs("prometheus")
    server = RedisServer().start()
    prometheus = None
    try:
        queue = f"q{unique}"
        client = redis.Redis.from_url(server.url)
        exporter = ExporterProcess(ops_env(server.url, queue, f"p{unique}"), tmp_path / "exporter.log").start()
        exporters.append(exporter)
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{exporter.port}", fast_rules(tmp_path / "rules.yml"))
        depth = f'celery_dlq_dead_letters{{dlq="DLQ.{queue}"}}'
        wait_for(lambda: prometheus.query(depth), 60, "Prometheus to scrape the empty DLQ", prometheus.log_path)
        assert not prometheus.firing("CeleryDLQGrowing", dlq=f"DLQ.{queue}")

        push_letters(client, queue, 3, at=time.time())
        (alert,) = wait_for(lambda: prometheus.firing("CeleryDLQGrowing", dlq=f"DLQ.{queue}"), 60,
                            "CeleryDLQGrowing to fire", prometheus.log_path)
        assert alert["labels"]["queue"] == queue and alert["labels"]["severity"] == "warning"
        assert alert["annotations"]["summary"] == f"Dead letters are arriving in DLQ.{queue}"
        assert prometheus.query(depth)[0]["value"][1] == "3"

        server.stop()
        wait_for(lambda: prometheus.firing("CeleryDLQExporterRedisDown"), 60, "CeleryDLQExporterRedisDown to fire",
                 prometheus.log_path)
    finally:
        if prometheus is not None:
            prometheus.stop()
        server.stop()
