-- ack.lua: delete a claimed entry once its message is back on its queue.
--
-- KEYS[1] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[2] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[3] = queues    (HASH) entry_id -> original queue name
-- KEYS[4] = parked    (HASH) queue -> entries parked or leased for that queue
--
-- ARGV[1] = entry_id
-- ARGV[2] = lease expiry the claimer got (ms)
--
-- The lease expiry is the claimer's fencing token: if the lease expired and
-- another mover claimed the entry, the score differs and this mover must not
-- delete the other's lease. Returns 1 when deleted, 0 when the lease is not ours.

local id = ARGV[1]
local score = redis.call('ZSCORE', KEYS[1], id)
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
    return 0
end
redis.call('ZREM', KEYS[1], id)
local queue = redis.call('HGET', KEYS[3], id)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
if queue and redis.call('HINCRBY', KEYS[4], queue, -1) <= 0 then
    redis.call('HDEL', KEYS[4], queue)
end
return 1
