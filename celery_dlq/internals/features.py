"""Every feature that rests on another library's internals, in the order a worker checks them at start."""
from __future__ import annotations

from celery_dlq.internals.base import Feature, Internal
from celery_dlq.internals.billiard_einfo import COMPACT_TRACEBACKS
from celery_dlq.internals.celery_backend import CHORD_KEYS
from celery_dlq.internals.celery_canvas import CHORD_UNLOCK
from celery_dlq.internals.celery_worker import DISCARDS, EXPIRED_TAKEOVER, POOL_IO, REQUEST_STATE, UNCOUNT
from celery_dlq.internals.kombu_redis import DIRECT_PARK, FETCH, FETCH_HEALTH, OPTIONAL_REAUTH

FEATURES: tuple[Feature, ...] = (FETCH, FETCH_HEALTH, DIRECT_PARK, COMPACT_TRACEBACKS, POOL_IO, EXPIRED_TAKEOVER,
                                 REQUEST_STATE, DISCARDS, UNCOUNT, CHORD_KEYS, CHORD_UNLOCK)

#: Internals used where present and expected to be absent in older releases (no warning when missing).
OPTIONAL: tuple[Internal, ...] = (OPTIONAL_REAUTH,)


def every_internal() -> list[tuple[Feature, Internal]]:
    return [(feature, internal) for feature in FEATURES for internal in feature.internals]
