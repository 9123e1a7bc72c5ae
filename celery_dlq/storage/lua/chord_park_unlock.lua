-- chord_park_unlock.lua: park Celery's celery.chord_unlock call while a member of its chord waits in a DLQ.
--
-- KEYS[1] = group    (SET)    the chord's waiting members (keys.chord_waiting)
-- KEYS[2] = unlock   (STRING) the chord's parked call (keys.chord_unlock)
--
-- ARGV[1] = the call (JSON: args, kwargs, queue)
--
-- Returns 1 when parked (a member waits: the call is kept, never expiring, and sent again by whoever settles
-- the last waiting member: chord_hold.lua, chord_settle.lua), 0 when none waits (chord_unlock runs as usual).
-- The check and the write are one step, so a member settled meanwhile either sees the parked call or
-- leaves nothing to park.

if redis.call('SCARD', KEYS[1]) == 0 then
    return 0
end
redis.call('SET', KEYS[2], ARGV[1])
return 1
