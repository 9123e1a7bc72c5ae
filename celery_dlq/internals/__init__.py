"""The one seam between celery-dlq and the private internals of celery, kombu and billiard.

Each private name celery-dlq uses is an :class:`~celery_dlq.internals.base.Internal`
in one of :mod:`.kombu_redis`, :mod:`.celery_worker`, :mod:`.billiard_einfo`,
grouped into the :class:`~celery_dlq.internals.base.Feature` that needs it
(:data:`.features.FEATURES`). A worker checks every feature at start
(:func:`~celery_dlq.internals.base.usable`); one whose internal moved is
switched off with one WARNING naming it, and its fallback runs instead.
docs/internals.md says what each is for.
"""
