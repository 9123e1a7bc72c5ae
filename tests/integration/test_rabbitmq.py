"""Cross-broker: RabbitMQ as the broker, celery-dlq's store on Redis (``dlq_redis_url``).

Parked retries live in Redis and go back to RabbitMQ through kombu; dead
letters are published to a real ``DLQ.<queue>`` queue on RabbitMQ. Uses the
RabbitMQ these machines run on 127.0.0.1:5672 (guest/guest), with queue names
of its own, deleted afterwards.
"""
from __future__ import annotations

import json
import socket

import pytest
from celery import Celery
from kombu import Connection

from celery_dlq import headers as H

pytestmark = pytest.mark.integration

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def rabbitmq_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
        return True
    except OSError:
        return False


@pytest.fixture
def rabbit(harness):
    if not rabbitmq_up():
        pytest.skip("no RabbitMQ on 127.0.0.1:5672")
    harness.extra_env.update(DLQ_TEST_BROKER=AMQP, DLQ_TEST_REDIS=harness.broker,
                             DLQ_TEST_CONF=json.dumps({"dlq_redis_url": harness.broker}))
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
