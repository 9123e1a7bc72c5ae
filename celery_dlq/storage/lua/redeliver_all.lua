-- redeliver_all.lua: make a batch of not-yet-due parked entries due now.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = wake      (ZSET) the moving worker's wake-up marker: written when any entry is made due
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
if #ids > 0 then
    redis.call('ZADD', KEYS[2], 0, 'due')
end
return #ids
