-- move_due.lua: move every due direct-format entry onto its destination list, inside Redis.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[3] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[4] = queues    (HASH) entry_id -> original queue name (publish format only)
-- KEYS[5] = parked    (HASH) queue -> entries parked or leased for that queue
-- KEYS[6] = stats     (HASH) counter name -> integer: `redelivered` counts the moves
-- KEYS[7] = events    (STREAM) the archive: one `redelivered` event per move
-- KEYS[8] = expiries  (HASH) entry_id -> when the message expires (ms; only messages with `expires`)
-- KEYS[9], KEYS[10], ... = destination lists (LIST) the caller expects (kombu's lists of the parked
--                         queues, every priority step); a payload naming another list is left for the
--                         publish path, so every key the script touches is passed in KEYS
--
-- ARGV[1] = now (ms)
-- ARGV[2] = limit: most due entries looked at
-- ARGV[3] = the archive's MAXLEN (approximate); 0: no events
-- ARGV[4] = the events' time (integer microseconds)
-- ARGV[5] = the stats counter that counts the moves ("" for none)
--
-- Expired leases (a publish-path mover died mid-batch) become due again first.
-- Then up to `limit` due entries, oldest due first: a direct-format entry is
-- LPUSHed (as kombu publishes) onto its list and deleted with its bookkeeping
-- in the same step, so nothing is lost and nothing moves twice; a
-- publish-format entry (parked before an upgrade, or for another broker), or
-- one for a list not in KEYS, is left where it is for the publish path; so is an entry whose message
-- expired (its `expiries` time has passed): the mover claims it and dead-letters it (reason `expired`)
-- instead of moving it, as Celery would discard it. Entries parked with no `expiries` field (no
-- `expires`, or parked by an earlier release) are moved as before.
-- Returns {moved, left, queue, task, n, queue, task, n, ...}: how many moved, how many due
-- entries were left, and how many moved per queue and task (the caller counts them for the exporter).

local now, limit = ARGV[1], tonumber(ARGV[2])

restore_expired_leases(KEYS[1], KEYS[2], now, limit)

local lists = {}
for i = 9, #KEYS do
    lists[KEYS[i]] = i
end
local moved, left, per_task = move_due_entries(1, lists, now, limit, tonumber(ARGV[3]), ARGV[4], ARGV[5])
return append_moves({moved, left}, per_task)
