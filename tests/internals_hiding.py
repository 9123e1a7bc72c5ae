"""Make one internal look moved to celery-dlq's seam, while the library itself keeps working.

A library that renames a private attribute renames it for its own code too,
so deleting it from the real class would break the library, not simulate a
move. Instead the seam's view of the owner (``internals.base.resolve``) is
replaced by a class without it: a subclass where the attribute raises
AttributeError, or, for an instance attribute, a class whose ``__init__``
(the method that assigned it) no longer does and whose other class
attributes are the owner's.
"""
from __future__ import annotations

from typing import Any

from celery_dlq.internals import base
from celery_dlq.internals.features import every_internal

SEPARATOR = "|"


def key(internal: base.Internal) -> str:
    return f"{internal.owner}{SEPARATOR}{internal.name}"


def internal_named(spec: str) -> base.Internal:
    return next(internal for _, internal in every_internal() if key(internal) == spec)


class _Gone:
    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        raise AttributeError(self.name)


class _Forwarding(type):
    """A class whose other class attributes are its model's (the internals of the same owner stay there)."""

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls.__dict__["_model"], name)


def without(owner: type, internal: base.Internal) -> type:
    if internal.kind == base.INSTANCE_ATTRIBUTE:
        original = getattr(owner, internal.assigned_in)

        def same_but_assigning_nothing(self, *args, **kwargs):
            return original(self, *args, **kwargs)

        return _Forwarding(owner.__name__, (), {internal.assigned_in: same_but_assigning_nothing, "_model": owner})
    return type(owner.__name__, (owner,), {internal.name: _Gone()})


def hide(spec: str, patch: Any = None) -> base.Internal:
    """Hide the internal ``"owner|name"`` from the seam; ``patch``: a pytest monkeypatch (else for good)."""
    internal = internal_named(spec)
    resolve = base.resolve

    def resolve_without(owner_spec: str) -> Any:
        found = resolve(owner_spec)
        return without(found, internal) if owner_spec == internal.owner else found

    if patch is not None:
        patch.setattr(base, "resolve", resolve_without)
    else:
        base.resolve = resolve_without
    base.forget()
    return internal
