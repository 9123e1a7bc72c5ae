-- park.lua: store a message to be delivered again at a due time.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[3] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[4] = queues    (HASH) entry_id -> original queue name
-- KEYS[5] = parked    (HASH) queue -> entries parked or leased for that queue
-- KEYS[6] = stats     (HASH) counter name -> integer: its `parked` counter counts parks
--
-- ARGV[1] = entry_id
-- ARGV[2] = payload (opaque bytes)
-- ARGV[3] = queue
-- ARGV[4] = due time (ms)
--
-- Returns 1 when parked, 0 when entry_id is already parked or leased (nothing
-- changes: a redelivered failure must not park, or count, twice). One round
-- trip parks and counts.

local id = ARGV[1]
if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)
        or redis.call('HEXISTS', KEYS[3], id) == 1 then
    return 0
end
redis.call('HSET', KEYS[3], id, ARGV[2])
redis.call('HSET', KEYS[4], id, ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[4], id)
redis.call('HINCRBY', KEYS[5], ARGV[3], 1)
redis.call('HINCRBY', KEYS[6], 'parked', 1)
return 1
