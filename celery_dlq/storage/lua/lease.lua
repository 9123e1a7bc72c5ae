-- lease.lua: renew or give up a lease on its own key, always checking its owner (storage/lease.py).
--
-- KEYS[1] = lease  (STRING) the owner's id; its time to live is what the lease has left
--
-- ARGV[1] = "renew" or "release"
-- ARGV[2] = the owner (a worker process, a releasing thread)
-- ARGV[3] = the lease's time to live (ms; unused by "release")
--
-- renew: renew the owner's own lease only; release: delete the owner's own only. Returns 1 when the owner
-- held the lease (and holds it still, or gave it up), 0 when another owner holds it or nobody does
-- (nothing done). The lease is taken with SET NX PX, no script: one command, as cheap as a beat can be,
-- and NX never takes a lease another holds. The logic is lib.lua's (lease_*).
local op, owner = ARGV[1], ARGV[2]
if op == 'renew' then
  return lease_renew(KEYS[1], owner, ARGV[3])
elseif op == 'release' then
  return lease_release(KEYS[1], owner)
end
return redis.error_reply('lease.lua: unknown op ' .. tostring(op))
