"""billiard internals: compact pickled tracebacks (one code position per frame, not the whole table).

Every failed or retried task builds a ``billiard.einfo.ExceptionInfo``,
whose picklable ``Traceback`` copies each frame's code object; on Python
>= 3.11 that copy includes ``list(code.co_positions())``, one tuple per
instruction of the whole function, for every frame, on every failure (and
it crosses the prefork result pipe). A traceback only reads one position per
frame, the one of its last instruction, so :func:`compact_tracebacks` makes
billiard keep just that one: through ``Traceback.Frame`` (billiard's hook
for the frame class) a frame copies no positions, and a wrapper around
``Traceback.__init__`` then stores the one its entry reads. Tracebacks
format exactly as before; :func:`formats_identically` checks it at start.
"""
from __future__ import annotations

import itertools
import pickle
import sys
import traceback
from collections.abc import Iterator
from typing import Any

from billiard import einfo

from celery_dlq.internals.base import ATTRIBUTE, INSTANCE_ATTRIBUTE, METHOD, Feature, Internal

UNKNOWN = (None, None, None, None)
_MARK = "_celery_dlq_compact"


class Positions:
    """``co_positions()`` of a frame as a traceback reads it: unknown up to ``index``, then ``position``."""

    __slots__ = ("index", "position")

    def __init__(self, index: int, position: tuple) -> None:
        self.index, self.position = index, position

    def __iter__(self) -> Iterator[tuple]:
        return itertools.chain(itertools.repeat(UNKNOWN, self.index), (self.position,))

    def __reduce__(self) -> tuple:
        return Positions, (self.index, self.position)


class _WithoutPositions:
    """A code object as billiard's ``_Code`` reads it, but with no positions to copy."""

    def __init__(self, code: Any) -> None:
        self._code = code

    def __getattr__(self, name: str) -> Any:
        return getattr(self._code, name)

    def co_positions(self) -> Iterator[tuple]:
        return iter(())


#: Positions already looked up, by code object and offset: the same frames fail again and again, and a
#: lookup decodes the position table from the start (a code object's positions never change).
_positions: dict[tuple[int, int], tuple[Any, tuple]] = {}
_POSITIONS_KEPT = 4096


def position_at(code: Any, lasti: int) -> tuple:
    """The position of the instruction at byte offset ``lasti`` (what ``traceback`` looks up), or unknown."""
    key = (id(code), lasti)
    cached = _positions.get(key)
    if cached is not None and cached[0] is code:
        return cached[1]
    position = next(itertools.islice(code.co_positions(), max(lasti, 0) // 2, None), UNKNOWN)
    if len(_positions) >= _POSITIONS_KEPT:
        _positions.clear()
    _positions[key] = (code, position)
    return position


def _compact_classes() -> tuple[type, type]:
    class CompactCode(einfo._Frame.Code):
        """billiard's picklable code object (it copies what it copies), without the position table."""

        def __init__(self, code: Any) -> None:
            super().__init__(_WithoutPositions(code))
            self._co_positions = Positions(0, UNKNOWN)

        def __reduce__(self) -> tuple:   # unpickles as billiard's own class
            base = einfo._Frame.Code
            return base.__new__, (base,), self.__dict__

    class CompactFrame(einfo.Traceback.Frame):
        Code = CompactCode

        def __reduce__(self) -> tuple:
            base = einfo._Frame
            return base.__new__, (base,), self.__dict__

    return CompactCode, CompactFrame


def _wrap_init(original: Any) -> Any:
    def __init__(self: Any, tb: Any, *args: Any, **kwargs: Any) -> None:
        original(self, tb, *args, **kwargs)
        code = self.tb_frame.f_code
        code._co_positions = Positions(max(tb.tb_lasti, 0) // 2, position_at(tb.tb_frame.f_code, tb.tb_lasti))

    __init__.__wrapped__ = original   # type: ignore[attr-defined]
    return __init__


def compact_tracebacks() -> bool:
    """Make billiard's ``Traceback`` keep one position per frame; False where there is nothing to do."""
    if sys.version_info < (3, 11) or getattr(einfo.Traceback, _MARK, False):
        return False
    _, frame = _compact_classes()
    einfo.Traceback.Frame = frame
    einfo.Traceback.__init__ = _wrap_init(einfo.Traceback.__init__)
    setattr(einfo.Traceback, _MARK, True)
    return True


def undo() -> None:
    """billiard's tracebacks as they were (tests)."""
    if getattr(einfo.Traceback, _MARK, False):
        einfo.Traceback.__init__ = einfo.Traceback.__init__.__wrapped__
        einfo.Traceback.Frame = einfo._Frame
        delattr(einfo.Traceback, _MARK)


def _formatted(exc: BaseException) -> str:
    """The traceback as the worker's main process formats it: billiard's copy, pickled across the pool pipe."""
    copy = pickle.loads(pickle.dumps(einfo.Traceback(exc.__traceback__)))
    return "".join(traceback.format_tb(copy))


def _fail(values: dict) -> int:
    return values["missing"] + 1   # a sub-expression: Python >= 3.11 draws carets under it


def formats_identically() -> str | None:
    """Format one real exception through a compact and a stock ``Traceback``; a problem if they differ."""
    if sys.version_info < (3, 11):
        return None
    try:
        _fail({})
    except KeyError as exc:
        stock = "".join(traceback.format_tb(exc.__traceback__))
        was_on = getattr(einfo.Traceback, _MARK, False)
        compact_tracebacks()
        try:
            text = _formatted(exc)
        finally:
            if not was_on:
                undo()
    if text != stock:
        return "billiard.einfo.Traceback formats differently with one position per frame"
    return None


COMPACT_TRACEBACKS = Feature(
    name="compact tracebacks",
    does="compact pickled tracebacks (one code position per frame)",
    fallback="billiard's own tracebacks (each frame copies its whole position table)",
    internals=(
        Internal("billiard.einfo:Traceback", "Frame", ATTRIBUTE, "the frame class a traceback builds"),
        Internal("billiard.einfo:_Frame", "Code", ATTRIBUTE, "the code class a frame builds"),
        Internal("billiard.einfo:Traceback", "__init__", METHOD, "wrapped: stores the one position read",
                 ("self", "tb")),
        *((Internal("billiard.einfo:_Code", "_co_positions", INSTANCE_ATTRIBUTE, "the copied position table"),)
          if sys.version_info >= (3, 11) else ()),
    ),
    behaves=formats_identically,
)
