"""fetch.lua's KEYS and ARGV composed from declared sections (storage/fetch.py): the header, and a fetch with
every combination of the optional sections (tests/integration/on_redis runs it again on a real redis-server)."""
from __future__ import annotations

import itertools
import json
import re

import pytest

from celery_dlq.storage.fetch import SECTIONS, FetchLayout, Section, compose, header_of, run_fetch
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts, script_body
from celery_dlq.storage.store import DirectPayload, ParkedStore
from celery_dlq.worker.fetch.moves import FetchMoves
from tests.unit.test_fetch import celery_message

NOW = 1_700_000_000.0
PRIO = "\x06\x163"


def test_the_lua_reads_the_sections_in_the_declared_order():
    names, numbers = re.search(r"^local (CLOCK, [A-Z, ]+) = ([\d, ]+)$", script_body("fetch"), re.M).groups()
    assert tuple(name.strip().lower() for name in names.split(",")) == SECTIONS
    assert [int(number) for number in numbers.split(",")] == list(range(1, len(SECTIONS) + 1))


def test_compose_puts_every_offset_in_the_header_and_an_absent_section_counts_zero():
    keys, args = compose([Section("lists", ("a", "b")), Section("clock", (), (7,)),
                          Section("holds", ("h1", "h2", "h3"), ("q", "q"))])
    assert keys == ["a", "b", "h1", "h2", "h3"]
    header = header_of(args)   # ARGV[1] is the header: the arguments start at ARGV[2], args[1] here
    assert header["clock"] == (1, 0, 2, 1) and args[1] == 7
    assert header["lists"] == (1, 2, 3, 0)
    assert header["holds"] == (3, 3, 3, 2) and args[2:] == ["q", "q"]
    assert header["markers"][1::2] == (0, 0) and header["moves"][1::2] == (0, 0)
    assert len(args[0]) == 2 * 2 * (len(SECTIONS) + 1)   # 16-bit numbers: each section's firsts, then the ends


def test_a_section_not_declared_or_given_twice_is_refused():
    with pytest.raises(ValueError):
        compose([Section("nope")])
    with pytest.raises(ValueError):
        compose([Section("lists", ("a",)), Section("lists", ("b",))])


COMBINATIONS = list(itertools.product((False, True), repeat=4))


@pytest.mark.parametrize(("markers", "holds", "moves", "beat"), COMBINATIONS)
def test_a_layouts_compose_is_its_sections_composed(markers, holds, moves, beat):
    """The channel's per-fetch compose fills a template made once: the same KEYS and ARGV as the sections."""
    keys = Keys("p")
    layout = FetchLayout(keys, "c1", ("q", "q\x06\x163"), ("q", "q"), markers=("q",) if markers else (),
                         holds=holds, moves=keys.move_keys())
    for register in (False, True):
        call = {"now_ms": 12, "beat": beat, "register": register, "moves": (20, 100, 7, "redelivered") if moves else ()}
        assert layout.compose(**call) == compose(layout.sections(**call))


@pytest.mark.parametrize(("markers", "holds", "moves", "beat"), COMBINATIONS,
                         ids=["-".join(name for name, on in zip(("markers", "holds", "moves", "beat"), combo) if on)
                              or "bare" for combo in COMBINATIONS])
def test_a_fetch_with_any_sections_present_reads_each_of_them_where_it_is(any_redis, unique, markers, holds, moves,
                                                                          beat):
    """A junk element (quarantined), a message a breaker holds, a plain one and, with moves, a due parked entry:
    each section's keys and arguments are found where the header says, whichever others are present."""
    keys, q = Keys(f"s{unique}"), f"q{unique}"
    lists = (q, q + PRIO)
    store = ParkedStore(any_redis, keys, clock=lambda: NOW)
    fetch_moves = FetchMoves(tuple(keys.move_keys()), 100)
    layout = FetchLayout(keys, "c1", lists, (q, q), markers=(q,) if markers else (), holds=holds,
                         moves=fetch_moves.keys)
    held = celery_message(task_id="h", tag=f"held-{unique}", task="shop.held")
    plain = celery_message(task_id="p", tag=f"plain-{unique}")
    moved = celery_message(task_id="m", tag=f"moved-{unique}")
    any_redis.lpush(q, b"junk", json.dumps(held), json.dumps(plain))          # popped from the right: junk first
    any_redis.hset(keys.breaker_holds, f"{q}\x1fshop.held", int(NOW * 1000) + 60_000)
    store.park("m:2", DirectPayload(q, q + PRIO, "proj.add", json.dumps(moved).encode()).dumps(), q, due=NOW - 1)

    def fetch(now: float = NOW, register: bool = False):
        return run_fetch(Scripts(any_redis), layout, now_ms=int(now * 1000), beat=beat, register=register,
                         moves=fetch_moves.args(now) if moves else ())

    try:
        first = fetch()
        assert first[:4] == [1, b"junk", b"quarantined", b""]
        assert any_redis.lrange(keys.quarantine(q), 0, -1) == [b"junk"]
        assert first[5:] == ([q.encode(), b"proj.add", 1] if moves else [])
        assert store.count() == (0 if moves else 1)
        taken = []
        while (reply := fetch()) is not None and reply != 0:
            assert reply[2] == b"ok"
            taken.append(reply[3].decode())
        expected = {f"plain-{unique}"} | ({f"moved-{unique}"} if moves else set()) | \
            (set() if holds else {f"held-{unique}"})
        assert set(taken) == expected
        assert {tag.decode() for tag in any_redis.hkeys(keys.inflight("c1"))} == expected
        assert any_redis.zcard(keys.breaker_held_raw) == (1 if holds else 0)
        assert any_redis.zscore(keys.consumers, "c1") == (NOW * 1000 if beat else None)
        # empty now: with markers, not heard yet (registered, no wait on them); then heard (0: wait on them)
        assert any_redis.zscore(keys.fetch_queues, q) == (NOW * 1000 if markers else None)
        any_redis.sadd(keys.fetch_listening, q)
        assert fetch(NOW + 1, register=True) == (0 if markers else None)
        assert any_redis.zscore(keys.fetch_queues, q) == ((NOW + 1) * 1000 if markers else None)
    finally:
        any_redis.delete(*lists, keys.quarantine(q), keys.inflight("c1"), keys.consumers, keys.fetch_queues,
                         keys.fetch_listening, keys.breaker_holds, keys.breaker_held_raw, keys.breaker_kept_total,
                         *keys.move_keys(), keys.fetch_marker(q))
