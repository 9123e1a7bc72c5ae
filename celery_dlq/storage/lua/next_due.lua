-- next_due.lua: the earliest time at which claim_due would find something.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- ARGV[1] = (NUMBER) a lease counts as ending no later than this (ms), or "" for its expiry: a mover of an
--           earlier release gives its claims back before they expire, without waking anyone
--
-- Returns the lowest score (ms, as a string) over both sets: the earliest due
-- time or lease expiry, since an expired lease becomes due again. Returns
-- false (nil) when the store is empty.

local best = nil
for i = 1, 2 do
    local head = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    local score = head[2]
    if score and i == 2 and ARGV[1] ~= '' and tonumber(ARGV[1]) < tonumber(score) then
        score = ARGV[1]
    end
    if score and (best == nil or tonumber(score) < tonumber(best)) then
        best = score
    end
end
if best == nil then
    return false
end
return best
