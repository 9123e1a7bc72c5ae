-- count_delivery.lua: count one more delivery of a task's message.
--
-- KEYS[1] = count key (STRING) integer: deliveries seen so far
--
-- ARGV[1] = floor: the delivery number the message's own header claims (integer >= 1)
-- ARGV[2] = ttl of the counter (whole seconds)
--
-- Returns the delivery number of this delivery. The counter never drops below
-- the header's claim, so an expired or lost counter cannot grant extra attempts.

local count = redis.call('INCR', KEYS[1])
local floor = tonumber(ARGV[1])
if count < floor then
    redis.call('SET', KEYS[1], ARGV[1])
    count = floor
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return count
