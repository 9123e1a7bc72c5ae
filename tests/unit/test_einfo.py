"""Compact pickled tracebacks (celery_dlq.internals.billiard_einfo): the same traceback text, without whole position tables."""
from __future__ import annotations

import pickle
import sys
import traceback

import pytest
from billiard import einfo

from celery_dlq.internals.billiard_einfo import Positions, compact_tracebacks, position_at

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="billiard copies code positions on 3.11+ only")


def big_function(fail: bool) -> int:
    """Many instructions before the failing one, as Celery's trace_task has."""
    total = 0
    for i in range(3):
        total += i * 2 - 1
        total = total * 3 % 7 + (i or 1) // 1
        total += sum(j * i for j in range(5)) - len([k for k in range(i)])
        total = (total << 1) >> 1
    data = {"a": total, "b": [1, 2, 3]}
    return data["missing"] + data["b"][0] if fail else total


def caller() -> int:
    return big_function(True) + 1


def captured() -> tuple[einfo.ExceptionInfo, str, str]:
    """billiard's ExceptionInfo of a failure, and the live traceback's text: whole, and its frames."""
    try:
        caller()
    except KeyError:
        exc_info = sys.exc_info()
        return (einfo.ExceptionInfo(), "".join(traceback.format_exception(*exc_info)),
                "".join(traceback.format_tb(exc_info[2])))
    raise AssertionError("no exception")


def test_a_compact_traceback_formats_exactly_as_the_live_one_after_a_pickle_round_trip():
    compact_tracebacks()
    info, live, live_frames = captured()
    restored = pickle.loads(pickle.dumps(info))                     # as it crosses the pool's result pipe
    frames_text = "".join(traceback.format_tb(restored.tb))
    assert frames_text == live_frames and "~~~~^^^^^^^^^^^" in frames_text   # carets included
    assert restored.traceback == live                               # billiard's own preformatted text
    frames = []
    tb = info.tb
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    assert all(isinstance(f.tb_frame.f_code._co_positions, Positions) for f in frames)


def test_a_frame_keeps_one_position_instead_of_the_whole_table():
    code = big_function.__code__
    full = list(code.co_positions())
    assert len(full) > 50
    lasti = 2 * (len(full) - 3)
    kept = Positions(lasti // 2, position_at(code, lasti))
    assert list(kept)[lasti // 2] == full[lasti // 2] and len(pickle.dumps(kept)) < 200
    assert len(pickle.dumps(full)) > 5 * len(pickle.dumps(kept))


def test_it_is_installed_once():
    compact_tracebacks()
    assert compact_tracebacks() is False


def test_a_position_looked_up_again_is_the_same_and_every_offset_matches_the_table():
    code = big_function.__code__
    table = list(code.co_positions())
    for lasti in range(0, 2 * len(table), 2):
        assert position_at(code, lasti) == table[lasti // 2] == position_at(code, lasti)   # computed, then cached
    assert position_at(caller.__code__, 0) == next(caller.__code__.co_positions())       # keyed by code object
