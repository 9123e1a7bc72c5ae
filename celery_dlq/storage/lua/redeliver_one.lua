-- redeliver_one.lua: make one parked entry due now (operator "retry now").
--
-- KEYS[1] = delayed   (ZSET) entry_id -> due time (ms)
-- KEYS[2] = wake      (ZSET) the moving worker's wake-up marker: written when the entry is made due
--
-- ARGV[1] = entry_id
-- ARGV[2] = now (ms)
--
-- A due time already in the past is kept, so the entry keeps its place in the
-- line. A leased entry is being moved already and is left alone.
-- Returns 1 when the entry is parked (and now due), 0 when it is not parked.

local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
    return 0
end
if tonumber(score) > tonumber(ARGV[2]) then
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
    redis.call('ZADD', KEYS[2], 0, 'due')
end
return 1
