"""The shop's Celery configuration: queues, routes, and the redelivery policies per queue.

The delays are short so the demo finishes in seconds; in production you would
wait longer (say ``redelivery_delay = 30``) and let the multiplier spread the
retries of a struggling payment gateway over minutes.
"""
import os

from kombu import Queue

broker_url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
broker_connection_retry_on_startup = True

task_queues = [Queue("orders"), Queue("payments")]
task_default_queue = "orders"
task_routes = {
    "shop.orders.*": {"queue": "orders"},
    "shop.payments.*": {"queue": "payments"},
}
# Send task events so Flower (docker-compose.yml) can show every delivery.
worker_send_task_events = True
task_send_sent_event = True

# Every shop task is a celery_dlq.RedeliveryTask (set in app.py); these say how
# each queue's failures are redelivered. Patterns use "." between words,
# "*" for one word and "#" for zero or more, so "payments.#" covers "payments"
# and a later "payments.eu".
dlq_queue_policies = {
    # Order handling: a few quick retries, then a human looks at DLQ.orders.
    "orders.#": {
        "redelivery_delay": 0.5,
        "max_delivery_attempts": 3,
    },
    # Payment gateways have bad minutes: back off exponentially (0.5 s, 1 s, 2 s,
    # capped at 5 s), but a declined card is final and goes straight to DLQ.payments.
    "payments.#": {
        "redelivery_delay": 0.5,
        "redelivery_multiplier": 2,
        "max_redelivery_delay": 5,
        "max_delivery_attempts": 4,
        "dead_letter_on": ["examples.shop.gateway:CardDeclined"],
    },
}
dlq_mover_interval = 0.1   # how often each worker looks for due redeliveries (default 0.2 s)
