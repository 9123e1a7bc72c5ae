"""Deprecated alias of :mod:`celery_dlq.ops`, kept for one release: ``from celery_dlq.ops import Operator, ...``.

Importing it warns (:class:`DeprecationWarning`) and gives the same names.
"""
from __future__ import annotations

import warnings

from celery_dlq.ops import *  # noqa: F403  (the same names, one definition)
from celery_dlq.ops import __all__  # noqa: F401

warnings.warn("celery_dlq.manage is deprecated and will be removed in the next release: "
              "import the same names from celery_dlq.ops", DeprecationWarning, stacklevel=2)
