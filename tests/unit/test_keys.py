"""Key names, and the rules every Lua script follows (header table, keys via KEYS)."""
from __future__ import annotations

import re
from importlib import resources

import fakeredis
import pytest
from redis.crc import key_slot

from celery_dlq.errors import ConfigurationError
from celery_dlq.storage.counters import DeliveryCounters
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import PRELUDE, SCRIPT_NAMES, Scripts, script_body, script_source
from celery_dlq.storage.sharding import Shards, shard_index, shard_tag

LUA_DIR = resources.files("celery_dlq.storage").joinpath("lua")


def test_key_names_share_one_hash_tag():
    keys = Keys()
    assert keys.base == "{celery_dlq}"
    assert keys.delayed == "{celery_dlq}:delayed"
    assert keys.leases == "{celery_dlq}:leases"
    assert keys.payloads == "{celery_dlq}:payloads"
    assert keys.queues == "{celery_dlq}:queues"
    assert keys.parked == "{celery_dlq}:parked"
    assert keys.stats == "{celery_dlq}:stats"
    assert keys.delivery_count("abc") == "{celery_dlq}:count:abc"
    assert keys.audit("abc", 3) == "{celery_dlq}:audit:abc:3"
    assert keys.store_keys() == (keys.delayed, keys.leases, keys.payloads,
                                 keys.queues, keys.parked)


def test_the_dashboards_keys_share_the_hash_tag():
    keys = Keys(prefix="app", global_keyprefix="t:")
    assert keys.web_session("ab12") == "t:{app}:web:session:ab12"
    assert keys.web_sessions == "t:{app}:web:sessions"
    assert keys.web_login_failures("addr", "10.0.0.1") == "t:{app}:web:failures:addr:10.0.0.1"
    assert len({key_slot(k.encode()) for k in (keys.web_session("x"), keys.web_sessions, keys.stats)}) == 1


def test_global_keyprefix_goes_in_front_of_the_hash_tag():
    keys = Keys(prefix="app", global_keyprefix="tenant1:")
    assert keys.delayed == "tenant1:{app}:delayed"
    assert keys.delivery_count("t") == "tenant1:{app}:count:t"


def test_one_shard_is_the_unsharded_layout():
    shards = Shards(prefix="app", global_keyprefix="t:")
    assert shards.all == shards.shards == (shards.home,) and shards.home.base == "t:{app}"
    assert shards.of("any-task").events == Keys("app", "t:").events == "t:{app}:events"


def test_shards_have_their_own_hash_tags_and_a_task_always_picks_the_same():
    shards = Shards(prefix="app", count=6)
    assert all(re.fullmatch(rf"\{{app:{i}(:\d+)?\}}", keys.base) for i, keys in enumerate(shards.shards))
    assert [key_slot(keys.stats.encode()) * 6 // 16384 for keys in shards.shards] == list(range(6))  # evenly spread
    assert shards.all[0] is shards.home and shards.home.base == "{app}" and len(shards.all) == 7
    picked = {shards.index(f"task-{n}") for n in range(600)}
    assert picked == set(range(6))                       # every shard gets tasks
    assert shards.of("abc") is shards.shards[shard_index("abc", 6)] is shards.of("abc")
    assert shard_index("abc", 6) == 0x352441C2 % 6       # CRC-32, the same in every process and language


def test_shard_tags_spread_over_equal_slot_ranges_for_any_count():
    for count in (2, 3, 5, 16, 100):
        slots = [key_slot(shard_tag("celery_dlq", i, count).encode()) for i in range(count)]
        assert [slot * count // 16384 for slot in slots] == list(range(count)), count


def test_an_earlier_layout_is_read_after_this_one_and_stray_tags_are_ignored():
    shards = Shards(prefix="app", count=2)
    older = Shards(prefix="app", count=3)
    both = shards.with_earlier([*older.tags, *shards.tags, "other:1", "app:{x}", "app"])
    current = [k.base for k in (shards.home, *shards.shards)]
    assert [k.base for k in both.shards] == current[1:]
    assert [k.base for k in both.all] == current + sorted(set(k.base for k in older.shards) - set(current))
    assert both.of("t-1").base == shards.of("t-1").base           # writes never go to an earlier layout
    assert Shards(prefix="app").with_earlier(older.tags).all[0].base == "{app}"


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "2", 1025])
def test_bad_shard_count_is_rejected(count):
    with pytest.raises(ConfigurationError, match="dlq_store_shards"):
        Shards(count=count)


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b"])
def test_bad_prefix_is_rejected(prefix):
    with pytest.raises(ConfigurationError, match="prefix"):
        Keys(prefix=prefix)


def test_every_script_file_is_named_and_every_name_has_a_file():
    files = {p.name[:-4] for p in LUA_DIR.iterdir() if p.name.endswith(".lua")}
    assert files == set(SCRIPT_NAMES) | {PRELUDE}     # lib.lua is prepended to each, not run alone
    with pytest.raises(KeyError):
        script_source("nope")


def _header(source: str) -> str:
    lines = []
    for line in source.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_header_documents_every_key_and_argument(name):
    source = script_body(name)
    header = _header(source)
    assert header.startswith(f"-- {name}.lua: ")
    body = source[len(header):]
    for kind in ("KEYS", "ARGV"):
        used = set(re.findall(kind + r"\[(\d+)\]", body))
        documented = set(re.findall(r"^-- " + kind + r"\[(\d+)\] = ", header, re.M))
        assert used <= documented, f"{name}: {kind} used but not in the header"
    for line in re.findall(r"^-- KEYS\[\d+\] = .*$", header, re.M):
        assert re.search(r"\((ZSET|HASH|STRING|LIST|SET|STREAM)\)", line), line


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_scripts_only_touch_keys_passed_in_keys(name):
    body = script_body(name)
    for command, key in re.findall(r"redis\.p?call\('(\w+)',\s*([^,)]+)", body):
        assert re.fullmatch(r"KEYS\[[\w +*\[\]-]+\]|unpack\(KEYS|unpack\(key_args", key), f"{name}: {command} on {key}"
    # a command whose keys do not come first (LMPOP) takes them from a table filled from KEYS only
    for target, value in re.findall(r"key_args\[([^\]]+)\] = ([^\n]+)", body):
        assert re.fullmatch(r"KEYS\[[\w +*]+\]|'[A-Z]+'", value.strip()), f"{name}: key_args[{target}] = {value}"


def test_scripts_are_registered_once_per_client():
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    scripts = Scripts(client)
    assert scripts.get("count") is scripts.get("count")
    assert Scripts(client).get("count") is not scripts.get("count")
    assert scripts.run("count", ["{t}:a", "{t}:b"], []) == 0


def counters(client, unique, ttl):
    return DeliveryCounters(client, Shards(prefix=f"test-{unique}"), Scripts(client), ttl)


def test_count_delivery_increments_floors_and_expires(any_redis, unique):
    key = Keys(prefix=f"test-{unique}").delivery_count("task-1")
    try:
        # Called for restored instances only: the first delivery (1) was not recorded.
        assert counters(any_redis, unique, 60).count("task-1", None, floor=1) == 2
        assert counters(any_redis, unique, 60).count("task-1", None, floor=1) == 3
        assert 0 < any_redis.ttl(key) <= 60
        assert counters(any_redis, unique, 60).count("task-1", None, floor=5) == 5  # the header knows better
        assert counters(any_redis, unique, 60).count("task-1", None, floor=3) == 6
        assert counters(any_redis, unique, 0.2).count("task-1", None, floor=1) == 7
        assert any_redis.ttl(key) == 1  # whole seconds, rounded up
        with pytest.raises(ValueError):
            counters(any_redis, unique, 60).count("task-1", None, floor=0)
        with pytest.raises(ValueError):
            counters(any_redis, unique, 0)
    finally:
        any_redis.delete(key)


def test_count_delivery_on_a_lost_counter_counts_one_past_the_header(any_redis, unique):
    key = Keys(prefix=f"test-{unique}").delivery_count("task-2")
    try:
        assert counters(any_redis, unique, 10).count("task-2", None, floor=4) == 5
        any_redis.set(key, 3)   # taken back by a stopping worker: delivery 4 never started
        assert counters(any_redis, unique, 10).count("task-2", None, floor=4) == 4
    finally:
        any_redis.delete(key)
