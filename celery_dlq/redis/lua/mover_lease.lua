-- mover_lease.lua: which worker moves due entries: take or keep the lease, else the standby's place, else count.
--
-- KEYS[1] = lease    (STRING) the moving worker's id; expires after ARGV[2] ms unless renewed
-- KEYS[2] = standby  (STRING) the worker that takes the lease over once it expires; expires after ARGV[3] ms
-- KEYS[3] = movers   (ZSET) id of every other mover -> until when it counts (ms)
--
-- ARGV[1] = this mover's id
-- ARGV[2] = the lease's time to live (ms)
-- ARGV[3] = the standby place's time to live (ms)
-- ARGV[4] = now (ms)
-- ARGV[5] = until when this mover counts among the others (ms)
-- ARGV[6] = "release" to give up the lease and the standby place (a worker stopping), "" otherwise
--
-- One worker holds the lease and moves; one more, the standby, watches the lease and takes it the
-- moment it expires; every other worker only counts itself here and tries again after an interval
-- scaled by that count, so the tries of all of them together keep one rate however many there are.
-- Returns {role, others}: role 1 = holds the lease (taken now or renewed), 2 = standby, 0 = neither
-- (3 after a release); others = how many other movers count (role 0 only, else 0).

local id = ARGV[1]
local holder = redis.call('GET', KEYS[1])
if ARGV[6] == 'release' then
    if holder == id then
        redis.call('DEL', KEYS[1])
    end
    if redis.call('GET', KEYS[2]) == id then
        redis.call('DEL', KEYS[2])
    end
    redis.call('ZREM', KEYS[3], id)
    return {3, 0}
end
if holder == id then
    redis.call('SET', KEYS[1], id, 'PX', ARGV[2])
    return {1, 0}
end
local standby = redis.call('GET', KEYS[2])
if not holder then
    redis.call('SET', KEYS[1], id, 'PX', ARGV[2])
    if standby == id then
        redis.call('DEL', KEYS[2])
    end
    redis.call('ZREM', KEYS[3], id)
    return {1, 0}
end
if not standby or standby == id then
    redis.call('SET', KEYS[2], id, 'PX', ARGV[3])
    if not standby then
        redis.call('ZREM', KEYS[3], id)
    end
    return {2, 0}
end
redis.call('ZADD', KEYS[3], ARGV[5], id)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[4])
return {0, redis.call('ZCARD', KEYS[3])}
