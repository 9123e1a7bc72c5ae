"""A small shop on Celery + celery-dlq: orders and payments queues with their own policies.

    celery -A examples.shop worker -Q orders,payments -l INFO

See examples/README.md for the walkthrough.
"""
from examples.shop.app import app

__all__ = ["app"]
