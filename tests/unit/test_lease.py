"""The one lease: acquire, renew and release with an owner check, the index form, and every lease user on it."""
from __future__ import annotations

import re
from pathlib import Path

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.lease import LEASES, Lease, LeaseIndex

PACKAGE = Path(__file__).resolve().parents[2] / "celery_dlq"


def test_only_its_owner_renews_or_gives_up_a_lease_and_another_takes_it_once_free(any_redis):
    a = Lease(any_redis, "lease:x", "a", 5_000)
    b = Lease(any_redis, "lease:x", "b", 5_000)
    assert a.acquire() and any_redis.get("lease:x") == b"a" and 4_900 < any_redis.pttl("lease:x") <= 5_000
    assert not b.acquire() and not b.renew() and not b.release()   # another's: nothing done
    assert any_redis.get("lease:x") == b"a"
    any_redis.pexpire("lease:x", 1_000)
    assert not b.renew() and any_redis.pttl("lease:x") <= 1_000    # b's renew did not refresh a's lease
    assert not a.acquire() and any_redis.pttl("lease:x") <= 1_000  # a holder renews; acquire takes a free one
    assert a.renew() and any_redis.pttl("lease:x") > 4_900
    assert a.release() and any_redis.get("lease:x") is None
    assert not a.renew() and not a.release() and any_redis.get("lease:x") is None   # gone: never recreated
    assert b.acquire() and any_redis.get("lease:x") == b"b"
    any_redis.delete("lease:x")                                   # b's lease expired
    assert not b.renew() and a.acquire() and not b.release() and any_redis.get("lease:x") == b"a"


def test_a_lease_index_holds_many_leases_and_finds_those_that_ran_out(any_redis):
    index = LeaseIndex(any_redis, "leases:x")
    assert index.first() is None and index.lapsed(10, 5) == []
    index.hold("one", 100)
    index.hold("two", 50)
    index.hold("three", 200)
    assert index.first() == ("two", 50)
    assert index.members() == [("two", 50), ("one", 100), ("three", 200)]
    assert index.lapsed(100, 5) == ["two", "one"] and index.lapsed(100, 5, inclusive=False) == ["two"]
    assert index.lapsed(1_000, 1) == ["two"]
    index.hold("two", 300)                                          # a beat or a renewal moves it on
    assert index.first() == ("one", 100)


def _source(relative: str) -> str:
    return (PACKAGE / relative).read_text("utf-8")


def test_the_registry_lists_every_lease_and_each_is_taken_through_the_one_lease():
    assert [use.name for use in LEASES] == ["leader", "breaker release", "claims", "jobs", "in-flight beats"]
    for use in LEASES:
        assert hasattr(Keys, use.key), use
        assert use.form in ("key", "index"), use
        text = "".join(_source(where if where.startswith(("worker/", "storage/")) else f"storage/{where}")
                       for where in use.taken_in)
        assert f".{use.key}" in text or use.form == "index", use
        for where in use.taken_in:
            one = _source(where if where.startswith(("worker/", "storage/")) else f"storage/{where}")
            if where.endswith(".lua"):
                assert re.search(r"\blease_(renew|release|hold|live|lapsed|end|drop)\(|restore_expired_leases\(",
                                 one), (use, where)
            elif use.form == "key":
                assert re.search(r"\b(Leader)?Lease\(", one), (use, where)
            else:
                assert "LeaseIndex(" in one and f".{use.key}" in one, (use, where)


#: A Redis command that writes a key, as a redis-py call.
PY_WRITES = re.compile(r"\.(set|pexpire|expire|persist|zadd|delete|getset|setex|psetex|setnx)\(|nx=True|xx=True")
LEASE_KEY = re.compile(r"\.(?:" + "|".join(re.escape(use.key) for use in LEASES) + r")\b")
#: A script's header line naming a lease index it takes: ``-- KEYS[2] = leases (ZSET) ...``.
LUA_INDEX = re.compile(r"^-- KEYS\[([^\]]+)\]\s*=?\s*(?:leases|consumers)\b", re.M)


def python_offenders(text: str, name: str) -> list[str]:
    """Lines of ``text`` that send a write naming a lease key."""
    return [f"{name}:{number}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1)
            if LEASE_KEY.search(line) and PY_WRITES.search(line)]


def lua_offenders(text: str, name: str) -> list[str]:
    """Lines of a script (not lib.lua) that expire or SET NX/XX a key, or ZADD or ZREM a lease index it takes."""
    found = [f"{name}:{number}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1)
             if re.search(r"'PEXPIRE'|'NX'|'XX'", line.split("--", 1)[0])]
    indexes = {re.sub(r"[\s*]", "", index) for index in LUA_INDEX.findall(text)}
    for call in re.finditer(r"redis\.call\('(?:ZADD|ZREM)',\s*KEYS\[([^\]]+)\]", text):
        if re.sub(r"[\s*]", "", call.group(1)) in indexes:
            found.append(f"{name}: a write of a lease index: {call.group(0)}")
    return found


def test_no_code_but_the_lease_writes_a_lease_key():
    """Python: no line outside storage/lease.py sends a write naming a lease key (a hand-rolled SET NX, PEXPIRE,
    ZADD of a lease). Lua: only lib.lua's lease_* set, expire, score or end a lease."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name != "storage/lease.py":
            offenders += python_offenders(path.read_text("utf-8"), name)
    for path in sorted((PACKAGE / "storage" / "lua").glob("*.lua")):
        if path.name != "lib.lua":
            offenders += lua_offenders(path.read_text("utf-8"), path.name)
    assert offenders == []


def test_the_check_finds_a_hand_rolled_lease():
    """The check above can fail: what it forbids is what the release lock, the leader's lease, the in-flight
    beat and the claims were before the one lease."""
    for line in ("if not redis.client.set(redis.keys.breaker_release(q, t), me, nx=True, px=5000):",
                 "self.client.pexpire(self.keys.mover_lease, self.ttl_ms)",
                 "self.client.zadd(self.keys.consumers, {consumer: now_ms})"):
        assert python_offenders(line, "old.py"), line
    assert lua_offenders("redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])", "old.lua")
    fetch = "-- KEYS[2n+2]          consumers        (ZSET)\nredis.call('ZADD', KEYS[2 * n + 2], ARGV[4], ARGV[2])\n"
    claim = "-- KEYS[2] = leases    (ZSET)\nredis.call('ZADD', KEYS[2], lease_until, id)\n"
    ack = "-- KEYS[1] = leases    (ZSET)\nif score == token then redis.call('ZREM', KEYS[1], id) end\n"
    assert lua_offenders(fetch, "fetch.lua") and lua_offenders(claim, "claim_due.lua") and lua_offenders(ack, "ack")
    assert not lua_offenders(claim.replace("redis.call('ZADD', KEYS[2],", "lease_hold(KEYS[2], id,"), "new.lua")
