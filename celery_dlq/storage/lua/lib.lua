-- lib.lua: prepended to every script by scripts.py (one definition of the parked payload formats, of the
-- leases and of a DLQ's failure-group index).
--
-- A parked payload is one of:
--   publish format: JSON {"v": 1, "body": <base64>, ...} (Envelope.dumps); its queue is in the `queues`
--                   hash; a mover decodes it and publishes it through kombu (any broker);
--   direct format:  "\1" .. queue .. "\0" .. destination list key .. "\0" .. task name .. "\0" .. element,
--                   where element is the exact JSON kombu's Redis transport pops from that list; it has no
--                   `queues` field and move_due.lua LPUSHes it inside Redis.
local function direct_parts(payload)
    if not payload or string.byte(payload, 1) ~= 1 then
        return nil
    end
    local a = string.find(payload, '\0', 2, true)
    local b = a and string.find(payload, '\0', a + 1, true)
    local c = b and string.find(payload, '\0', b + 1, true)
    if not c then
        return nil
    end
    return {queue = string.sub(payload, 2, a - 1), dest = string.sub(payload, a + 1, b - 1),
            task = string.sub(payload, b + 1, c - 1), element = string.sub(payload, c + 1)}
end

-- The queue an entry is parked for: its `queues` field (publish format) or its payload (direct format).
local function parked_queue(queues_key, id, payload)
    local queue = redis.call('HGET', queues_key, id)
    if queue then
        return queue
    end
    local parts = direct_parts(payload)
    return parts and parts.queue
end

-- Leases (storage/lease.py: the one lease; every lease of celery-dlq is taken, renewed, checked and given up
-- by these functions, in lease.lua or inside a larger step). A lease has one owner until it expires.
--
-- On its own key (STRING: the owner's id, with PX the time it has left): the leader, a breaker's release.
-- It is taken with SET NX PX (storage/lease.py: one command, which never takes a lease another holds).
-- Renew OWNER's lease for TTL_MS more; 0 (nothing done) when it is another's or has expired.
local function lease_renew(key, owner, ttl_ms)
    if redis.call('GET', key) ~= owner then
        return 0
    end
    redis.call('PEXPIRE', key, ttl_ms)
    return 1
end

-- Give OWNER's lease up; 0 (nothing done) when it is another's or has expired.
local function lease_release(key, owner)
    if redis.call('GET', key) ~= owner then
        return 0
    end
    redis.call('DEL', key)
    return 1
end

-- In an index (ZSET member -> ms), many leases on one key, each member its own: the parked entries a mover
-- claimed (score: the claim's expiry), unfinished jobs (their expiry; the owner is in the job's record),
-- in-flight consumers (their last beat: each beat starts a lease of dlq_inflight_lease).
-- Hold MEMBER's lease: its score is AT_MS (an expiry, or a beat).
local function lease_hold(index, member, at_ms)
    redis.call('ZADD', index, at_ms, member)
end

-- Whether MEMBER's lease is live: its score is at least SINCE_MS (false when it holds none).
local function lease_live(index, member, since_ms)
    local at = redis.call('ZSCORE', index, member)
    return at ~= false and at ~= nil and tonumber(at) >= tonumber(since_ms)
end

-- Up to LIMIT members whose lease ran out: scored at most UPTO_MS (a ZRANGEBYSCORE bound: "(ms" excludes it).
local function lease_lapsed(index, upto_ms, limit)
    return redis.call('ZRANGEBYSCORE', index, '-inf', upto_ms, 'LIMIT', 0, limit)
end

-- Give up MEMBER's lease if it is still the one its holder took: scored TOKEN, the expiry the holder got (a
-- claim's fencing token: a mover whose claim expired, and was claimed again by another, must not end the
-- other's). True when it was, and is given up.
local function lease_end(index, member, token)
    local at = redis.call('ZSCORE', index, member)
    if not at or tonumber(at) ~= tonumber(token) then
        return false
    end
    redis.call('ZREM', index, member)
    return true
end

-- Drop MEMBER's lease, whoever holds it (its job ended, its consumer is gone, its entry removed); how many
-- were dropped (0 or 1).
local function lease_drop(index, member)
    return redis.call('ZREM', index, member)
end

-- Claims whose lease expired (their mover died or stalled between claim and ack) become due again, scored now.
local function restore_expired_leases(delayed_key, leases_key, now, limit)
    for _, id in ipairs(lease_lapsed(leases_key, now, limit)) do
        lease_drop(leases_key, id)
        redis.call('ZADD', delayed_key, now, id)
    end
end

-- A due entry whose payload is gone cannot be delivered: delete it and take it off its queue's count.
local function forget_entry(delayed_key, queues_key, parked_key, expiries_key, id)
    redis.call('ZREM', delayed_key, id)
    redis.call('HDEL', expiries_key, id)
    local queue = redis.call('HGET', queues_key, id)
    redis.call('HDEL', queues_key, id)
    if queue and redis.call('HINCRBY', parked_key, queue, -1) <= 0 then
        redis.call('HDEL', parked_key, queue)
    end
end


-- Move up to LIMIT due direct-format entries onto their lists, each with its bookkeeping in the same step
-- (move_due.lua for the mover; fetch.lua for the fetching worker's own lists). S is where the store's keys
-- start in KEYS, in move_due.lua's order: delayed, leases, payloads, queues, parked, stats, events, expiries.
-- LISTS maps each list that may be written to its index in KEYS; an entry for another list, in the publish
-- format, or expired while parked is left (counted in `left`). One `redelivered` event per move (MAX_LENGTH
-- 0: none) at time TS (us); COUNTER ('' for none) in the stats hash counts the moves.
-- Returns moved, left and {"<queue>\0<task>" = moves}.
local function move_due_entries(s, lists, now, limit, max_length, ts, counter)
    local delayed, payloads, queues, parked = KEYS[s], KEYS[s + 2], KEYS[s + 3], KEYS[s + 4]
    local stats, events, expiries = KEYS[s + 5], KEYS[s + 6], KEYS[s + 7]
    local moved, left, per_queue, per_task = 0, 0, {}, {}
    local any_expiry = redis.call('HLEN', expiries) > 0   -- none parked with `expires`: no lookups at all
    local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
    for _, id in ipairs(due) do
        local payload = redis.call('HGET', payloads, id)
        local parts = direct_parts(payload)
        local list = parts and lists[parts.dest]
        local expiry = list and any_expiry and redis.call('HGET', expiries, id)
        if expiry and tonumber(expiry) <= tonumber(now) then
            list = nil   -- expired while parked: left for the claim, which dead-letters it
        end
        if list then
            redis.call('LPUSH', KEYS[list], parts.element)
            redis.call('ZREM', delayed, id)
            redis.call('HDEL', payloads, id)
            if expiry then
                redis.call('HDEL', expiries, id)
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
                redis.pcall('XADD', events, 'MAXLEN', '~', max_length, '*', 'v', '1', 'type', 'redelivered',
                            'ts_us', ts, 'task_id', task_id or id, 'task_name', parts.task,
                            'queue', parts.queue, 'delivery', delivery or '0')
            end
        elseif payload then
            left = left + 1
        else
            forget_entry(delayed, queues, parked, expiries, id)
        end
    end
    for queue, n in pairs(per_queue) do   -- the parked counts, once per queue and batch
        if redis.call('HINCRBY', parked, queue, -n) <= 0 then
            redis.call('HDEL', parked, queue)
        end
    end
    if moved > 0 and counter ~= '' then
        redis.call('HINCRBY', stats, counter, moved)
    end
    return moved, left, per_task
end

-- Append to REPLY the moves of PER_TASK (from move_due_entries) as queue, task, n, queue, task, n, ...
local function append_moves(reply, per_task)
    for label, n in pairs(per_task) do
        local cut = string.find(label, '\0', 1, true)
        reply[#reply + 1] = string.sub(label, 1, cut - 1)
        reply[#reply + 1] = string.sub(label, cut + 1)
        reply[#reply + 1] = n
    end
    return reply
end

-- A ring slot: FIELD holds "<stamp>:<count>"; a slot last written for another stamp starts again at n.
-- So a ring of N slots keeps the last N minutes or hours in N fields, whatever the traffic.
local function ring_add(key, field, stamp, n)
    local seen = redis.call('HGET', key, field)
    local count = n
    if seen then
        local colon = string.find(seen, ':', 1, true)
        if colon and tonumber(string.sub(seen, 1, colon - 1)) == stamp then
            count = (tonumber(string.sub(seen, colon + 1)) or 0) + n
        end
    end
    redis.call('HSET', key, field, stamp .. ':' .. count)
end

-- Trends (HASH Keys.trends; redis/trends.py reads it): BASE ("<kind>|queue|<name>", "<kind>|reason|<name>")
-- counted in minute MINUTE (60 slots: the last hour) and hour MINUTE // 60 (168 slots: the last week).
local function trend_add(key, base, minute, n)
    local hour = math.floor(minute / 60)
    ring_add(key, base .. '|m' .. (minute % 60), minute, n)
    ring_add(key, base .. '|h' .. (hour % 168), hour, n)
end

-- A DLQ's failure groups (HASH, QueueLists.groups; redis/groups.py reads it). Fields, for group id G:
--   n:G            dead letters of G in the DLQ now
--   first:G last:G earliest and latest x-dlq-dead-lettered-at (unix s) of arrivals since G was last empty
--   r:G:<reason>   dead letters of G now, by reason
--   m:G            JSON written by the dead-letterer: task, exception type, title, sample (the latest arrival)
--   h:G:<0..23>    "<unix hour>:<arrivals in that hour>", a ring of the last 24 hours (the sparkline)
-- A letter without a group id ('': written by something else, or before groups existed) is not counted.
local function group_add(key, gid, reason, at, hour, meta)
    if gid == '' then
        return
    end
    if redis.call('HINCRBY', key, 'n:' .. gid, 1) == 1 then
        redis.call('HSET', key, 'first:' .. gid, at)
    end
    local last = tonumber(redis.call('HGET', key, 'last:' .. gid) or '0') or 0
    if (tonumber(at) or 0) >= last then
        redis.call('HSET', key, 'last:' .. gid, at)
    end
    redis.call('HSET', key, 'm:' .. gid, meta)
    redis.call('HINCRBY', key, 'r:' .. gid .. ':' .. reason, 1)
    ring_add(key, 'h:' .. gid .. ':' .. (tonumber(hour) % 24), tonumber(hour), 1)
end

local function group_remove(key, gid, reason)
    if gid == '' then
        return
    end
    local rfield = 'r:' .. gid .. ':' .. reason
    if redis.call('HINCRBY', key, rfield, -1) <= 0 then
        redis.call('HDEL', key, rfield)
    end
    if redis.call('HINCRBY', key, 'n:' .. gid, -1) <= 0 then
        for _, field in ipairs({'n:', 'first:', 'last:', 'm:'}) do
            redis.call('HDEL', key, field .. gid)
        end
        for slot = 0, 23 do
            redis.call('HDEL', key, 'h:' .. gid .. ':' .. slot)
        end
    end
end

-- In flight (redis/inflight.py): a consumer's record of a fetched message is the list it came from and the
-- element, "<length of the list's name>:<list><element>", so it can be given back byte for byte.
local function in_flight_value(list, element)
    return #list .. ':' .. list .. element
end

-- A message given back by a lost consumer opens with this extra top-level field, so the next fetch counts
-- the delivery (fetch.lua strips it; any other JSON reader ignores it).
local GIVEN_BACK = '{"x-dlq-redelivered":1,'

-- Circuit breakers (storage/breakers.py): whether an open breaker holds `task` on `queue` at `now` (ms), as
-- the holds hash says ("*" as the queue: every queue); if so the list element `raw` is kept, whole, in the
-- held deliveries (ZSET, score 0, "<queue>\31<task>\31<element>"), pushed back by release_held.lua, and
-- counted in `kept` (HASH "<queue>\31<task>" -> n).
local function breaker_keeps(holds, held, kept, queue, task, raw, now)
    if type(task) ~= 'string' then
        return false
    end
    local untils = redis.call('HMGET', holds, queue .. '\31' .. task, '*\31' .. task)
    if not ((untils[1] and tonumber(untils[1]) > now) or (untils[2] and tonumber(untils[2]) > now)) then
        return false
    end
    redis.call('ZADD', held, 0, queue .. '\31' .. task .. '\31' .. raw)
    redis.call('HINCRBY', kept, queue .. '\31' .. task, 1)
    return true
end

-- The task a kombu list element names (Celery's protocol 2 header), or nil.
local function element_task(element)
    local ok, message = pcall(cjson.decode, element)
    local headers = ok and type(message) == 'table' and message['headers']
    return type(headers) == 'table' and headers['task'] or nil
end
