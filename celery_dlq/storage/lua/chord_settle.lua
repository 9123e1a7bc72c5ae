-- chord_settle.lua: settle a waiting chord member once: released (its replay succeeded) or failed (purged).
--
-- KEYS[1] = member   (HASH)   the member's ledger entry (keys.chord_member)
-- KEYS[2] = group    (SET)    the chord's waiting members (keys.chord_waiting)
-- KEYS[3] = dlq      (SET)    the waiting members of the DLQ it was dead-lettered to (keys.chord_waiting_in)
-- KEYS[4] = unlock   (STRING) the chord's parked celery.chord_unlock call (keys.chord_unlock)
-- KEYS[5] = outcomes (HASH)   member id -> what its slot holds once settled (keys.chord_outcomes)
--
-- ARGV[1] = the member's task id
-- ARGV[2] = its new state: released or failed
-- ARGV[3] = seconds the settled entry is kept
-- ARGV[4] = the DLQ it must be waiting in ('' for any): a purge of another DLQ's copy settles nothing
-- ARGV[5] = what the member's slot holds when failed (JSON; '' when released: Celery stored its success
--           already), recorded in the step that stops the chord waiting (see chord_hold.lua)
--
-- Returns {its request context (JSON), the parked chord_unlock call ('' if none or others still wait)} when
-- this call settled it, else false: of a replay and a purge racing, or two replays, exactly one settles.

if redis.call('HGET', KEYS[1], 'state') ~= 'waiting' then
    return false
end
if ARGV[4] ~= '' and redis.call('HGET', KEYS[1], 'dlq') ~= ARGV[4] then
    return false
end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[5], redis.call('HGET', KEYS[1], 'member') or ARGV[1], ARGV[5])
    redis.call('EXPIRE', KEYS[5], tonumber(ARGV[3]))
end
local unlock = ''
if redis.call('SCARD', KEYS[2]) == 0 then
    unlock = redis.call('GET', KEYS[4]) or ''
    redis.call('DEL', KEYS[4])
end
return {redis.call('HGET', KEYS[1], 'context'), unlock}
