"""What an internal is, how its assumption is checked, and the one warning a worker logs when one moved.

An :class:`Internal` names one private attribute of celery, kombu or
billiard that celery-dlq relies on, says what for, and states the
assumption as a check: the attribute exists, a method takes these
parameters, an ``__init__`` assigns this instance attribute. A
:class:`Feature` is what celery-dlq switches off when one of its internals
fails its check, and the fallback that keeps working then.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("celery_dlq.internals")

#: How an internal is checked.
METHOD, ATTRIBUTE, INSTANCE_ATTRIBUTE = "method", "attribute", "instance attribute"


def resolve(spec: str) -> Any:
    """``"package.module:Class"`` (or a module) as the object it names."""
    module, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Internal:
    """One private name of another library, what celery-dlq uses it for, and how its assumption is checked.

    ``owner`` is ``"module:Class"``; ``params`` (methods) are the leading
    parameter names the method must take; an instance attribute must be
    assigned (``self.<name> = ``) in the ``__init__`` of the owner or of a
    class it inherits from.
    """

    owner: str
    name: str
    kind: str
    used_for: str
    params: tuple[str, ...] = ()
    #: The method that assigns an instance attribute.
    assigned_in: str = "__init__"

    @property
    def path(self) -> str:
        return f"{self.owner.replace(':', '.')}.{self.name}"

    def problem(self) -> str | None:
        """None if the assumption holds, else what is wrong (one line)."""
        try:
            owner = resolve(self.owner)
        except (ImportError, AttributeError) as exc:
            return f"{self.owner} is gone ({type(exc).__name__}: {exc})"
        if self.kind == INSTANCE_ATTRIBUTE:
            return None if _assigned_in(owner, self.assigned_in, self.name) else \
                f"{self.path} is no longer assigned in {owner.__name__}.{self.assigned_in}"
        if not hasattr(owner, self.name):
            return f"{self.path} is missing"
        if self.kind == METHOD:
            return _signature_problem(self.path, getattr(owner, self.name), self.params)
        return None

    def missing(self) -> bool:
        """Whether the owner has no such attribute at all (as in a release older than the one that added it)."""
        try:
            owner = resolve(self.owner)
        except (ImportError, AttributeError):
            return True
        if self.kind == INSTANCE_ATTRIBUTE:
            return not _assigned_in(owner, self.assigned_in, self.name)
        return not hasattr(owner, self.name)


def _signature_problem(path: str, method: Any, params: tuple[str, ...]) -> str | None:
    try:
        found = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError) as exc:
        return f"{path} is not a method with a signature ({exc})"
    names = [p.name for p in found]
    if names[:len(params)] != list(params):
        return f"{path} takes ({', '.join(names)}), expected ({', '.join(params)})"
    for extra in found[len(params):]:
        if extra.default is inspect.Parameter.empty and extra.kind not in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return f"{path} takes a new required parameter {extra.name!r}"
    return None


def _assigned_in(owner: type, method: str, name: str) -> bool:
    """Whether ``method`` of ``owner`` or of a class it inherits from assigns ``self.<name>``.

    Where no source can be read at all (an install without ``.py`` files) the
    assumption cannot be checked and is taken to hold.
    """
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=]*)?=(?!=)")
    read_any = False
    for cls in getattr(owner, "__mro__", (owner,)):
        init = cls.__dict__.get(method)
        if init is None:
            continue
        try:
            source = inspect.getsource(init)
        except (OSError, TypeError):
            continue
        read_any = True
        if pattern.search(source):
            return True
    return not read_any


@dataclass(frozen=True)
class Feature:
    """What celery-dlq does with a set of internals, and what a worker does instead when one moved."""

    name: str
    does: str
    fallback: str
    internals: tuple[Internal, ...]
    #: Extra check that runs code (e.g. formats a traceback both ways); returns a problem or None.
    behaves: Callable[[], str | None] | None = field(default=None, compare=False)
    #: The release that added these internals (e.g. ``"kombu 5.7"``); where every one of them is missing, an
    #: older release is installed and the feature is off without a warning.
    since: str = ""

    def predates(self) -> bool:
        """Whether the installed library is older than :attr:`since` (every internal missing)."""
        return bool(self.since) and all(internal.missing() for internal in self.internals)

    def problems(self) -> list[str]:
        found = [problem for problem in (internal.problem() for internal in self.internals) if problem]
        if not found and self.behaves is not None:
            try:
                found = [problem for problem in [self.behaves()] if problem]
            except Exception as exc:   # a check that crashes is a failed check
                found = [f"{self.name}: its behaviour check raised {type(exc).__name__}: {exc}"]
        return found


_reported: dict[str, list[str]] = {}


def usable(feature: Feature) -> bool:
    """Whether every internal of ``feature`` holds; the first time one fails, one WARNING names it.

    Checked once per process and feature (a worker start); :func:`forget`
    clears the record (tests). A feature of a release newer than the one
    installed (:meth:`Feature.predates`) is off without a warning.
    """
    if feature.name not in _reported:
        problems = _reported[feature.name] = feature.problems()
        if problems and feature.predates():
            logger.debug("celery-dlq: %s is off (needs %s)", feature.does, feature.since)
        elif problems:
            logger.warning("celery-dlq: %s; %s is off, %s", "; ".join(problems), feature.does, feature.fallback)
    return not _reported[feature.name]


def forget() -> None:
    _reported.clear()
