-- next_due.lua: the earliest time at which claim_due would find something.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
--
-- Returns the lowest score (ms, as a string) over both sets: the earliest due
-- time or lease expiry, since an expired lease becomes due again. Returns
-- false (nil) when the store is empty.

local best = nil
for i = 1, 2 do
    local head = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    if head[2] and (best == nil or tonumber(head[2]) < tonumber(best)) then
        best = head[2]
    end
end
if best == nil then
    return false
end
return best
