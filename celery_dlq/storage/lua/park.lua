-- park.lua: store a message to be delivered again at a due time.
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = leases    (ZSET) entry_id -> lease expiry (ms)
-- KEYS[3] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[4] = queues    (HASH) entry_id -> original queue name
-- KEYS[5] = parked    (HASH) queue -> entries parked or leased for that queue
-- KEYS[6] = stats     (HASH) counter name -> integer: its `parked` counter counts parks
-- KEYS[7] = events    (STREAM) the archive: the `parked` event is appended here
-- KEYS[8] = metrics   (HASH) the exporter's counters: ARGV[7] is raised by one per park
-- KEYS[9] = expiries  (HASH) entry_id -> when the message expires (ms): written with ARGV[8]
-- KEYS[10] = trends   (HASH) parks per minute and hour of ARGV[3]'s queue (lib.lua, trend_add; ARGV[9])
-- KEYS[11] = wake     (ZSET) the moving worker's wake-up marker: written when this entry is due before KEYS[12]
-- KEYS[12] = wake until (STRING) the earliest due time (ms) the moving worker read at its last look (next_due.lua);
--            absent: the marker is written when this entry becomes the earliest due
-- KEYS[13] = in flight (HASH) the consumer's fetched, unsettled messages (only with ARGV[6]; redis/inflight.py)
--
-- ARGV[1] = entry_id
-- ARGV[2] = payload (opaque bytes)
-- ARGV[3] = queue
-- ARGV[4] = due time (ms)
-- ARGV[5] = the archive's MAXLEN (approximate); 0: no event
-- ARGV[6] = the delivery tag of the consumed message to acknowledge in the same step ("" for none): on a
--           Redis broker that is also the store, parking and kombu's ack are one atomic step, so a crash
--           between them can neither lose the message nor deliver it twice
-- ARGV[7] = the metrics field this park raises (parked_total with its labels; "" for none)
-- ARGV[8] = when the message expires (ms; Celery's `expires`), "" when it never does: the mover
--           dead-letters an entry whose expiry passed instead of moving it
-- ARGV[9] = the unix minute of the park (the trends' bucket)
-- ARGV[10], ARGV[11], ... = the event's field, value pairs
--
-- Returns 3 when ARGV[6] names a message that is no longer unacknowledged and nothing is parked,
-- 0 when entry_id is already parked or leased (nothing changes: a
-- redelivered failure must not park, or count, twice), 1 when parked, 2 when
-- parked but the event could not be archived (the archive never fails a
-- park: its error is reported, not raised). One round trip parks, counts and
-- archives.

local id = ARGV[1]
if ARGV[6] and ARGV[6] ~= '' then   -- parked now or before: either way the consumed message is settled
    local held = redis.call('HDEL', KEYS[13], ARGV[6])
    if held == 0 and not (redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)
            or redis.call('HEXISTS', KEYS[3], id) == 1) then
        -- The consumed message is no longer this consumer's: given back to its queue (its heartbeat stopped
        -- for longer than the lease, a reconnect) or its fetch was lost with a failed-over master. That copy carries on; parking another
        -- would fork a second chain of deliveries.
        return 3
    end
end
if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)
        or redis.call('HEXISTS', KEYS[3], id) == 1 then
    return 0
end
redis.call('HSET', KEYS[3], id, ARGV[2])
if not direct_parts(ARGV[2]) then   -- a direct-format payload names its queue itself (lib.lua)
    redis.call('HSET', KEYS[4], id, ARGV[3])
end
redis.call('ZADD', KEYS[1], ARGV[4], id)
-- The moving worker waits for the earliest due time it read (KEYS[12]): an entry due sooner wakes it. Compared
-- with what it waits for, not with the head, which an earlier release's worker may have parked without the marker.
local wake_until = redis.call('GET', KEYS[12])
if wake_until then
    if tonumber(ARGV[4]) < tonumber(wake_until) then
        redis.call('ZADD', KEYS[11], 0, 'due')
    end
elseif redis.call('ZRANGE', KEYS[1], 0, 0)[1] == id then
    redis.call('ZADD', KEYS[11], 0, 'due')
end
if ARGV[8] and ARGV[8] ~= '' then
    redis.call('HSET', KEYS[9], id, ARGV[8])
end
redis.call('HINCRBY', KEYS[5], ARGV[3], 1)
redis.call('HINCRBY', KEYS[6], 'parked', 1)
if ARGV[7] and ARGV[7] ~= '' then
    redis.call('HINCRBY', KEYS[8], ARGV[7], 1)
end
trend_add(KEYS[10], 'parked|queue|' .. ARGV[3], tonumber(ARGV[9]), 1)
if tonumber(ARGV[5]) > 0 and #ARGV > 10 then
    local event = {}
    for i = 10, #ARGV do
        event[#event + 1] = ARGV[i]
    end
    local ok = redis.pcall('XADD', KEYS[7], 'MAXLEN', '~', ARGV[5], '*', unpack(event))
    if type(ok) == 'table' and ok.err then
        return 2
    end
end
return 1
