"""The shop's Celery app and tasks. Every task is a ``celery_dlq.RedeliveryTask``."""
from __future__ import annotations

from celery import Celery

import celery_dlq
from celery_dlq import RedeliveryPolicy, delivery_count
from examples.shop import gateway

app = Celery("shop", task_cls="celery_dlq:RedeliveryTask")
app.config_from_object("examples.shop.celeryconfig")


class AddressError(Exception):
    """The carrier rejected the address. Retried (maybe a carrier outage), then dead-lettered."""


@app.task(name="shop.orders.confirm")
def confirm(order_id: str) -> str:
    """Always succeeds: mark the order confirmed."""
    return f"{order_id} confirmed"


@app.task(name="shop.orders.ship")
def ship(order_id: str, postcode: str) -> str:
    """Books a carrier; postcode 00000 is never served, so this ends in DLQ.orders."""
    if postcode == "00000":
        raise AddressError(f"no carrier serves postcode {postcode} for {order_id}")
    return f"{order_id} shipped"


@app.task(bind=True, name="shop.payments.charge")
def charge(self, order_id: str, card: str, amount: float) -> str:
    """Charges a card; gateway timeouts are retried on the payments policy."""
    return gateway.charge(card, amount, attempt=delivery_count(self.request))


# A task-level policy wins over the queue's: a crash in the fraud model is
# worth one more try, not four.
@app.task(name="shop.payments.fraud_check",
          redelivery_policy=RedeliveryPolicy(max_delivery_attempts=2, redelivery_delay=0.2))
def fraud_check(order_id: str) -> float:
    return gateway.fraud_score(order_id)


celery_dlq.install(app)  # validates every dlq_* setting and policy now
