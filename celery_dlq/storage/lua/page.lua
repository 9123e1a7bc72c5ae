-- page.lua: one page of a sorted set of entries, with payloads and queues.
--
-- KEYS[1] = delayed or leases (ZSET) entry_id -> due time or lease expiry (ms)
-- KEYS[2] = payloads  (HASH) entry_id -> payload bytes
-- KEYS[3] = queues    (HASH) entry_id -> original queue name
--
-- ARGV[1] = lowest score of the page (ms, inclusive)
-- ARGV[2] = offset: entries with exactly that score the caller has seen already
-- ARGV[3] = page size
--
-- The caller pages by score, not by index: entries claimed or acked ahead of
-- the cursor meanwhile do not shift the page. Returns an array of rows
-- {entry_id, score, payload, queue}; a row without payload is {entry_id, score}
-- (the entry went away between commands) and only moves the cursor.

local ids = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf', 'WITHSCORES',
                       'LIMIT', tonumber(ARGV[2]), tonumber(ARGV[3]))
local rows = {}
for i = 1, #ids, 2 do
    local id, score = ids[i], ids[i + 1]
    local payload = redis.call('HGET', KEYS[2], id)
    if payload then
        rows[#rows + 1] = {id, score, payload, parked_queue(KEYS[3], id, payload) or ''}
    else
        rows[#rows + 1] = {id, score}
    end
end
return rows
