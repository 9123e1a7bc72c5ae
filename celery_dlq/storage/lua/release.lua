-- release.lua: give a claimed entry back, e.g. because publishing it failed.
--
-- KEYS[1] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[2] = delayed   (ZSET) entry_id -> due time (ms)
--
-- ARGV[1] = entry_id
-- ARGV[2] = lease expiry the claimer got (ms): its fencing token, as in ack.lua
-- ARGV[3] = new due time (ms)
--
-- Returns 1 when the entry is parked again, 0 when the lease is not ours.

local id = ARGV[1]
if not lease_end(KEYS[1], id, ARGV[2]) then   -- the claim is another's now, or gone (lib.lua)
    return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], id)
return 1
