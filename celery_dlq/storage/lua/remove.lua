-- remove.lua: delete a parked or leased entry outright (operator "delete").
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[3] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[4] = queues    (HASH) entry_id -> original queue name
-- KEYS[5] = parked    (HASH) queue -> entries parked or leased for that queue
-- KEYS[6] = expiries  (HASH) entry_id -> when the message expires (ms)
--
-- ARGV[1] = entry_id
--
-- Returns 1 when something was deleted, 0 when the entry was unknown.

local id = ARGV[1]
local removed = redis.call('ZREM', KEYS[1], id) + lease_drop(KEYS[2], id)   -- a claim's lease: lib.lua
local queue = parked_queue(KEYS[4], id, redis.call('HGET', KEYS[3], id))
removed = removed + redis.call('HDEL', KEYS[3], id) + redis.call('HDEL', KEYS[4], id)
redis.call('HDEL', KEYS[6], id)
if queue and redis.call('HINCRBY', KEYS[5], queue, -1) <= 0 then
    redis.call('HDEL', KEYS[5], queue)
end
if removed > 0 then
    return 1
end
return 0
