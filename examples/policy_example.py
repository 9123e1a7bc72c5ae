"""Runnable: how a redelivery policy turns failures into waits, and where policies come from.

    python examples/policy_example.py
"""
import random

from celery import Celery

import celery_dlq
from celery_dlq import RedeliveryPolicy, RedeliveryTask, resolve_policy

# The Artemis worked example: delay 5 s, multiplier 2, capped at 15 s.
policy = RedeliveryPolicy(redelivery_delay=5, redelivery_multiplier=2, max_redelivery_delay=15,
                          max_delivery_attempts=5)
print("waits after failed deliveries 1..4:", [policy.delay_after(n) for n in range(1, 5)])

# Collision-avoidance jitter, reproducible with a seeded rng.
jittery = RedeliveryPolicy(redelivery_delay=1, redelivery_collision_avoidance_factor=0.5)
rng = random.Random(42)
print("jittered waits:", [round(jittery.delay_after(n, rng), 3) for n in range(1, 4)])

app = Celery("shop", broker="redis://localhost:6379/0")
app.conf.dlq_default_policy = {"redelivery_delay": 1, "max_delivery_attempts": 5}
app.conf.dlq_queue_policies = {
    "payments.#": {"redelivery_delay": 10, "redelivery_multiplier": 2, "max_redelivery_delay": 300},
    "orders.*": {"max_delivery_attempts": 3},
}
app.conf.dlq_task_policies = {"shop.payments.*": {"dead_letter_on": ["builtins.PermissionError"]}}


@app.task(base=RedeliveryTask, name="shop.payments.charge",
          redelivery_policy=RedeliveryPolicy(max_delivery_attempts=8))
def charge(order_id):
    ...


celery_dlq.install(app)  # validates every setting above; nothing connects to Redis here
effective = resolve_policy(app, "shop.payments.charge", "payments.eu")
print("shop.payments.charge on payments.eu:")
for name in ("redelivery_delay", "redelivery_multiplier", "max_redelivery_delay",
             "max_delivery_attempts", "dead_letter_on"):
    print(f"  {name} = {getattr(effective, name)!r}")
print("  dead letters go to:", effective.dead_letter_queue("payments.eu"))
