-- claim_due.lua: lease the entries that are due, oldest due first.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[3] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[4] = queues    (HASH) entry_id -> original queue name
-- KEYS[5] = parked    (HASH) queue -> entries parked or leased for that queue
-- KEYS[6] = expiries  (HASH) entry_id -> when the message expires (ms)
--
-- ARGV[1] = now (ms)
-- ARGV[2] = lease expiry of the entries claimed now (ms), > now
-- ARGV[3] = limit: most entries to claim, and to restore from expired leases
--
-- First, leases that expired (expiry <= now) become due again, scored now:
-- their mover died or stalled between claim and ack. Then up to `limit` due
-- entries (due <= now) move from delayed to leases, scored with the expiry.
-- Entries stay in Redis until acked: nothing is popped, so nothing is lost.
--
-- Returns a flat array: entry_id, payload, queue for each claimed entry. An entry whose message
-- expired is claimed like any other: the mover dead-letters it instead of publishing it.
-- An entry without a payload cannot be delivered: it is deleted, not returned.

local now, lease_until, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])

restore_expired_leases(KEYS[1], KEYS[2], now, limit)

local claimed = {}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(due) do
    local payload = redis.call('HGET', KEYS[3], id)
    if payload then
        redis.call('ZREM', KEYS[1], id)
        lease_hold(KEYS[2], id, lease_until)   -- the claim is the entry's lease (lib.lua)
        claimed[#claimed + 1] = id
        claimed[#claimed + 1] = payload
        claimed[#claimed + 1] = parked_queue(KEYS[4], id, payload) or ''
    else
        forget_entry(KEYS[1], KEYS[4], KEYS[5], KEYS[6], id)
    end
end
return claimed
