-- ack.lua: delete claimed entries once their messages are back on their queues.
--
-- KEYS[1] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[2] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[3] = queues    (HASH) entry_id -> original queue name
-- KEYS[4] = parked    (HASH) queue -> entries parked or leased for that queue
-- KEYS[5] = stats     (HASH) counter name -> integer
-- KEYS[6] = expiries  (HASH) entry_id -> when the message expires (ms)
--
-- ARGV[1] = stats counter to add ARGV[2] to ("" for none)
-- ARGV[2] = amount to add: the messages the caller published
-- ARGV[3], ARGV[4], ... = entry_id, lease expiry the claimer got (ms); as many pairs as acked
--
-- A whole batch is acknowledged in one round trip. The lease expiry is each
-- claimer's fencing token: if a lease expired and another mover claimed the
-- entry, the score differs and this mover must not delete the other's lease.
-- Returns how many entries were deleted (those whose lease was still ours).

if ARGV[1] ~= '' and tonumber(ARGV[2]) > 0 then
    redis.call('HINCRBY', KEYS[5], ARGV[1], ARGV[2])
end
local deleted = 0
for i = 3, #ARGV, 2 do
    local id = ARGV[i]
    if lease_end(KEYS[1], id, ARGV[i + 1]) then   -- the claim is still this mover's (lib.lua)
        local queue = parked_queue(KEYS[3], id, redis.call('HGET', KEYS[2], id))
        redis.call('HDEL', KEYS[2], id)
        redis.call('HDEL', KEYS[3], id)
        redis.call('HDEL', KEYS[6], id)
        if queue and redis.call('HINCRBY', KEYS[4], queue, -1) <= 0 then
            redis.call('HDEL', KEYS[4], queue)
        end
        deleted = deleted + 1
    end
end
return deleted
