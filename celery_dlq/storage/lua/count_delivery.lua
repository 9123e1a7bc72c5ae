-- count_delivery.lua: count a repeated delivery of one message instance (kombu restored it).
--
-- KEYS[1] = count key (STRING) integer: deliveries of this instance recorded so far
--
-- ARGV[1] = floor: the delivery number the message's own header claims (integer >= 1)
-- ARGV[2] = ttl of the counter (whole seconds)
--
-- Only called for a message kombu marks `redelivered`: it was delivered
-- before. A first delivery is not written at all (its number is the
-- header's), so a missing counter means "delivered once already, unrecorded":
-- this delivery is floor + 1. An existing counter is incremented, never below
-- the header's claim, so a lost counter can never grant extra attempts.
-- Returns the delivery number of this delivery.

local floor = tonumber(ARGV[1])
local count
if redis.call('EXISTS', KEYS[1]) == 1 then
    count = redis.call('INCR', KEYS[1])
    if count < floor then
        count = floor
    end
else
    count = floor + 1
end
redis.call('SET', KEYS[1], count, 'EX', ARGV[2])
return count
