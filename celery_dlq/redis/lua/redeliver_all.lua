-- redeliver_all.lua: make a batch of not-yet-due parked entries due now.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
--
-- ARGV[1] = now (ms)
-- ARGV[2] = batch: most entries to reschedule in this call
--
-- The caller repeats until fewer than `batch` come back, so no single call
-- blocks Redis for long. Rescheduled entries score `now` and are not seen again.
-- Returns how many entries this call rescheduled.

local now = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
    redis.call('ZADD', KEYS[1], now, id)
end
return #ids
