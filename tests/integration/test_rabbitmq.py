"""Cross-broker: RabbitMQ as the broker, celery-dlq's store on Redis (``dlq_redis_url``).

Parked retries live in Redis and go back to RabbitMQ through kombu; dead
letters are published to a real ``DLQ.<queue>`` queue on RabbitMQ. Uses the
RabbitMQ these machines run on 127.0.0.1:5672 (guest/guest), with queue names
of its own, deleted afterwards.
"""
from __future__ import annotations

import json
import time

import pytest
from amqp.exceptions import NotFound
from celery import Celery
from kombu import Connection, Queue

from celery_dlq import headers as H
from tests.services import require_rabbitmq

pytestmark = pytest.mark.integration

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def rabbit(harness):
    require_rabbitmq()
    harness.extra_env.update(DLQ_TEST_BROKER=AMQP, DLQ_TEST_REDIS=harness.broker,
                             # a short mover lease: the tests kill workers, the mover among them
                             DLQ_TEST_CONF=json.dumps({"dlq_redis_url": harness.broker, "dlq_mover_lease": 2.0}))
    client = Celery("rabbit-client", broker=AMQP, set_as_current=False)
    client.conf.task_default_queue = harness.queue
    yield client
    for worker in harness.workers:  # before the queues go: a consumer of a deleted queue is cancelled
        worker.stop()
    with Connection(AMQP) as conn:
        channel = conn.default_channel
        for name in (harness.queue, f"DLQ.{harness.queue}"):
            try:
                channel.queue_delete(name)
            except Exception:
                channel = conn.channel()  # deleting a queue that was never declared closes the channel
    client.close()


def get_dead_letters(queue: str) -> list:
    with Connection(AMQP) as conn:
        channel = conn.default_channel
        letters = []
        while (message := channel.basic_get(queue=f"DLQ.{queue}", no_ack=True)) is not None:
            letters.append(message)
        return letters


def test_redelivery_through_redis_and_dead_letters_on_rabbitmq(harness, rabbit):
    harness.worker(concurrency=2)
    flaky = rabbit.send_task("proj.flaky", args=(1,), queue=harness.queue)
    doomed = rabbit.send_task("proj.always_fails", args=(5,), queue=harness.queue)
    harness.wait_until(lambda: len(harness.deliveries(flaky.id)) == 2, timeout=60, message="flaky redelivered")
    harness.wait_until(lambda: len(harness.deliveries(doomed.id)) == 3, timeout=60, message="three deliveries")
    assert [d["delivery"] for d in harness.deliveries(flaky.id)] == [1, 2]
    assert [d["delivery"] for d in harness.deliveries(doomed.id)] == [1, 2, 3]
    assert {tuple(d["args"]) for d in harness.deliveries(doomed.id)} == {(5,)}
    letters = []
    harness.wait_until(lambda: letters.extend(get_dead_letters(harness.queue)) or letters, timeout=30,
                       message="a dead letter on RabbitMQ")
    (letter,) = letters
    headers = letter.headers
    assert headers["id"] == doomed.id and headers["task"] == "proj.always_fails"
    assert headers[H.REASON] == "max_delivery_attempts"
    assert headers[H.ORIGINAL_QUEUE] == harness.queue
    assert headers[H.DELIVERY_COUNT] == 3
    assert "ValueError" in headers[H.EXCEPTION_TYPE]
    assert json.loads(letter.body)[0] == [5]            # the original body, untouched
    stats = f"{{{harness.prefix}}}:stats"
    assert harness.redis.hget(stats, "parked") == b"3"  # flaky once, doomed twice: parked in Redis
    assert harness.redis.hget(stats, "dead_lettered") == b"1"
    assert harness.redis.zcard(f"{{{harness.prefix}}}:delayed") == 0


def _dead_letters_if_any(queue: str) -> list:
    try:
        return get_dead_letters(queue)
    except NotFound:   # the first dead letter declares the DLQ
        return []


def _restart_until_dead_lettered(harness, queue: str, restarts: int = 4) -> list:
    """Start a worker, let the task kill it, start another, until the message is in ``DLQ.<queue>``."""
    letters: list = []
    for i in range(restarts):
        # A name per start: the shared RabbitMQ keeps each worker's exclusive pidbox queue until it notices
        # the killed one's connection is gone, and the other parametrization may run at the same time.
        worker = harness.worker(concurrency=1, name=f"k{i}-{harness.queue}")
        deadline = time.monotonic() + 30
        while worker.proc.poll() is None and time.monotonic() < deadline:
            letters.extend(_dead_letters_if_any(queue))
            if letters:
                return letters
            time.sleep(0.1)
        worker.stop()
    return letters + _dead_letters_if_any(queue)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_task_that_kills_its_whole_worker_is_counted_and_dead_lettered_on_rabbitmq(harness, rabbit, queue_type):
    """AMQP gives a redelivered message a new delivery tag: the count is kept by task id and body."""
    if queue_type == "quorum":
        conf = json.loads(harness.extra_env["DLQ_TEST_CONF"])
        conf["task_queues"] = {harness.queue: {"exchange": harness.queue, "routing_key": harness.queue,
                                               "queue_arguments": {"x-queue-type": "quorum"}}}
        harness.extra_env["DLQ_TEST_CONF"] = json.dumps(conf)
        rabbit.conf.task_queues = [Queue(harness.queue, routing_key=harness.queue,
                                         queue_arguments={"x-queue-type": "quorum"})]
        with Connection(AMQP) as conn:
            conn.default_channel.queue_declare(harness.queue, durable=True, auto_delete=False,
                                              arguments={"x-queue-type": "quorum"})
    killer = rabbit.send_task("proj.kills_worker", queue=harness.queue)
    twin = rabbit.send_task("proj.noop", args=(1,), queue=harness.queue, task_id=killer.id)  # same id, other body
    letters = _restart_until_dead_lettered(harness, harness.queue)
    assert len(letters) == 1, [w.log()[-2000:] for w in harness.workers]
    headers = letters[0].headers
    assert headers["id"] == killer.id and headers["task"] == "proj.kills_worker"
    assert headers[H.REASON] == "worker_lost"
    assert headers[H.DELIVERY_COUNT] == 2      # max_delivery_attempts: 2, both used by the kills
    kills = [d for d in harness.deliveries(killer.id) if d["task"] == "proj.kills_worker"]
    assert [d["delivery"] for d in kills] == [1, 2]
    if queue_type == "quorum":
        assert headers.get("x-delivery-count") == 2, headers  # RabbitMQ's own count agrees
    harness.wait_until(lambda: [d for d in harness.deliveries(twin.id) if d["task"] == "proj.noop"],
                       timeout=30, message="the other message under the same id ran, uncounted by the kills")
    # The last worker lives on: a parked retry goes back to this (quorum) queue through the mover.
    flaky = rabbit.send_task("proj.flaky", args=(1,), queue=harness.queue)
    harness.wait_until(lambda: len(harness.deliveries(flaky.id)) == 2, timeout=30, message="flaky redelivered")
    assert [d["delivery"] for d in harness.deliveries(flaky.id)] == [1, 2]
