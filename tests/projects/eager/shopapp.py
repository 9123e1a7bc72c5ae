"""A project that installs celery-dlq at import, as many do; its own tests run with no Redis at all."""
from celery import Celery

import celery_dlq

app = Celery("shopapp", broker="memory://", backend="cache+memory://")
app.conf.update(task_always_eager=True, dlq_default_policy={"max_delivery_attempts": 3})
celery_dlq.install(app)


class OutOfStock(Exception):
    pass


@app.task(bind=True, base=celery_dlq.RedeliveryTask, redelivery_policy={"redelivery_delay": 30})
def reserve(self, sku: str, qty: int) -> dict:
    if qty > 5:
        raise OutOfStock(sku)
    return {"sku": sku, "reserved": qty}


@app.task(bind=True, base=celery_dlq.RedeliveryTask, max_retries=2, default_retry_delay=0)
def charge(self, amount: int, fail_until: list) -> int:
    fail_until[0] -= 1
    if fail_until[0] > 0:
        raise self.retry(exc=ValueError("card declined"))
    return amount
