-- uncount.lua: take back one counted delivery of each message that never started.
--
-- KEYS[1], KEYS[2], ... = count keys (STRING) integer: deliveries seen so far, one per message
--
-- A counter that is gone (acknowledged, expired) stays gone: it is not
-- created at -1. One that drops to 0 is deleted. Returns how many were taken back.

local n = 0
for i = 1, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        if redis.call('DECR', KEYS[i]) <= 0 then
            redis.call('DEL', KEYS[i])
        end
        n = n + 1
    end
end
return n
