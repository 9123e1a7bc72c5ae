-- count.lua: how many entries the store holds.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
--
-- Returns parked + leased, read at one instant (an entry moving between the
-- two sets is never counted twice or missed).

return redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
