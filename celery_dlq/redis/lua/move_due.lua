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
local max_length, ts = tonumber(ARGV[3]), ARGV[4]

restore_expired_leases(KEYS[1], KEYS[2], now, limit)

local lists = {}
for i = 9, #KEYS do
    lists[KEYS[i]] = i
end

local moved, left, per_queue, per_task = 0, 0, {}, {}
local any_expiry = redis.call('HLEN', KEYS[8]) > 0   -- none parked with `expires`: no lookups at all
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(due) do
    local payload = redis.call('HGET', KEYS[3], id)
    local parts = direct_parts(payload)
    local list = parts and lists[parts.dest]
    local expiry = list and any_expiry and redis.call('HGET', KEYS[8], id)
    if expiry and tonumber(expiry) <= tonumber(now) then
        list = nil   -- expired while parked: left for the claim, which dead-letters it
    end
    if list then
        redis.call('LPUSH', KEYS[list], parts.element)
        redis.call('ZREM', KEYS[1], id)
        redis.call('HDEL', KEYS[3], id)
        if expiry then
            redis.call('HDEL', KEYS[8], id)
        end
        per_queue[parts.queue] = (per_queue[parts.queue] or 0) + 1
        local label = parts.queue .. '\0' .. parts.task
        per_task[label] = (per_task[label] or 0) + 1
        moved = moved + 1
        if max_length > 0 then
            -- entry ids are <task id>:<delivery>[:<delivery tag>]; a delivery tag is never all digits
            local task_id, delivery = string.match(id, '^(.*):(%d+)$')
            if not task_id then
                task_id, delivery = string.match(id, '^(.*):(%d+):[^:]*$')
            end
            redis.pcall('XADD', KEYS[7], 'MAXLEN', '~', max_length, '*', 'v', '1', 'type', 'redelivered',
                        'ts_us', ts, 'task_id', task_id or id, 'task_name', parts.task,
                        'queue', parts.queue, 'delivery', delivery or '0')
        end
    elseif payload then
        left = left + 1
    else
        forget_entry(KEYS[1], KEYS[4], KEYS[5], KEYS[8], id)
    end
end
for queue, n in pairs(per_queue) do   -- the parked counts, once per queue and batch
    if redis.call('HINCRBY', KEYS[5], queue, -n) <= 0 then
        redis.call('HDEL', KEYS[5], queue)
    end
end
if moved > 0 and ARGV[5] ~= '' then
    redis.call('HINCRBY', KEYS[6], ARGV[5], moved)
end
local reply = {moved, left}
for label, n in pairs(per_task) do
    local cut = string.find(label, '\0', 1, true)
    reply[#reply + 1] = string.sub(label, 1, cut - 1)
    reply[#reply + 1] = string.sub(label, cut + 1)
    reply[#reply + 1] = n
end
return reply
