-- inspect.lua: read one entry, consistently.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[3] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[4] = queues    (HASH) entry_id -> original queue name
--
-- ARGV[1] = entry_id
--
-- Returns {} when the entry is unknown, else {payload, queue, state, score}
-- where state is 'delayed' (score = due ms) or 'leased' (score = lease expiry ms).

local id = ARGV[1]
local payload = redis.call('HGET', KEYS[3], id)
if not payload then
    return {}
end
local queue = parked_queue(KEYS[4], id, payload) or ''
local score = redis.call('ZSCORE', KEYS[1], id)
if score then
    return {payload, queue, 'delayed', score}
end
score = redis.call('ZSCORE', KEYS[2], id)
if score then
    return {payload, queue, 'leased', score}
end
return {}
