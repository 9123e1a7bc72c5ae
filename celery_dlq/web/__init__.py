"""The web dashboard: ``celery -A proj dlq web``, or :func:`create_app` mounted in your own ASGI site.

Sidekiq's Dead tab for Celery: the DLQs, their dead letters (filtered as
``celery dlq list`` filters), each letter's headers, arguments and
traceback, replay and purge with a confirmation, and the parked retries.
Thin over :mod:`celery_dlq.ops`; Starlette, Jinja2 and uvicorn (the ``web``
extra) are imported only here.
"""
from celery_dlq.web.app import create_app

__all__ = ["create_app"]
