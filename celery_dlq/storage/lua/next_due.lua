-- next_due.lua: the earliest time at which claim_due would find something.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[3] = wake until (STRING) optional: the moving worker's look, written with what it found (park.lua
--           wakes it for an entry due sooner)
-- ARGV[1] = (NUMBER) a lease counts as ending no later than this (ms), or "" for its expiry: a mover of an
--           earlier release gives its claims back before they expire, without waking anyone
-- ARGV[2] = (NUMBER) with KEYS[3]: how long it lives (ms)
--
-- Returns the lowest score (ms, as a string) over both sets: the earliest due
-- time or lease expiry, since an expired lease becomes due again. Returns
-- false (nil) when the store is empty. Written with the look, in one step, so
-- that no park falls between what the worker read and what it waits for.

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
if KEYS[3] then
    redis.call('SET', KEYS[3], best or '9e15', 'PX', ARGV[2])
end
if best == nil then
    return false
end
return best
