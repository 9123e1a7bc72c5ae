"""Compact pickled tracebacks: billiard's ``ExceptionInfo`` without a copy of every frame's position table.

Every failed or retried task builds a ``billiard.einfo.ExceptionInfo`` (Celery's
``TraceInfo.handle_retry``/``handle_failure``), whose picklable ``Traceback``
copies each frame's code object. On Python >= 3.11 that copy includes
``list(code.co_positions())``: one tuple per instruction of the whole
function, for every frame, on every failure. The frame Celery catches in is
``trace_task``, a closure of thousands of instructions, so a failed delivery
spent about half of a solo worker's time building that list (py-spy, 5,000
tasks failing twice; see BENCHMARKS.md), and with prefork the list crossed
the result pipe, pickled in the child and unpickled in the main process.

A traceback only ever reads one position per frame: the one of its last
instruction (``traceback`` does ``islice(code.co_positions(), lasti // 2)``).
:func:`compact_tracebacks` makes billiard keep just that one
(:class:`Positions`), so tracebacks format exactly as before (carets
included) at a fraction of the cost and size. Idempotent; a no-op before
Python 3.11, where billiard copies no positions.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Iterator

from billiard import einfo

logger = logging.getLogger(__name__)

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


class CompactCode(einfo._Code):
    """billiard's picklable code object (billiard copies what it copies), its positions left for
    :func:`_traceback_init` to fill in."""

    def __init__(self, code: Any) -> None:
        super().__init__(_WithoutPositions(code))
        self._co_positions = Positions(0, UNKNOWN)

    def __reduce__(self) -> tuple:   # unpickles as billiard's own class, as before
        return einfo._Code.__new__, (einfo._Code,), self.__dict__


class CompactFrame(einfo._Frame):
    Code = CompactCode

    def __reduce__(self) -> tuple:
        return einfo._Frame.__new__, (einfo._Frame,), self.__dict__


def position_at(code: Any, lasti: int) -> tuple:
    """The position of the instruction at byte offset ``lasti`` (what ``traceback`` looks up), or unknown."""
    return next(itertools.islice(code.co_positions(), max(lasti, 0) // 2, None), UNKNOWN)


def _traceback_init(self: Any, tb: Any, max_frames: int = einfo.DEFAULT_MAX_FRAMES, depth: int = 0) -> None:
    """billiard's ``Traceback.__init__``, each frame keeping the one position its traceback entry reads."""
    self.tb_frame = CompactFrame(tb.tb_frame)
    self.tb_frame.f_code._co_positions = Positions(max(tb.tb_lasti, 0) // 2,
                                                   position_at(tb.tb_frame.f_code, tb.tb_lasti))
    self.tb_lineno = tb.tb_lineno
    self.tb_lasti = tb.tb_lasti
    self.tb_next = None
    if tb.tb_next is not None:
        if depth <= max_frames:
            self.tb_next = einfo.Traceback(tb.tb_next, max_frames, depth + 1)
        else:
            self.tb_next = einfo._Truncated()


def compact_tracebacks() -> bool:
    """Make billiard's ``Traceback`` keep one position per frame; False where there is nothing to do."""
    if not hasattr(einfo._Code, "co_positions") or getattr(einfo.Traceback, _MARK, False):
        return False
    einfo.Traceback.__init__ = _traceback_init
    setattr(einfo.Traceback, _MARK, True)
    logger.debug("celery-dlq: billiard tracebacks keep one code position per frame")
    return True
