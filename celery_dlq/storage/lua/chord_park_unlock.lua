-- chord_park_unlock.lua: park Celery's celery.chord_unlock call while a member of its chord waits in a DLQ.
--
-- KEYS[1] = group    (SET)    the chord's waiting members (keys.chord_waiting)
-- KEYS[2] = unlock   (STRING) the chord's parked call (keys.chord_unlock)
-- KEYS[3] = outcomes (HASH)   member id -> what its slot holds once settled (keys.chord_outcomes)
--
-- ARGV[1] = the call (JSON: args, kwargs, queue)
--
-- Returns {1} when parked (a member waits: the call is kept, never expiring, and sent again by whoever settles
-- the last waiting member: chord_hold.lua, chord_settle.lua), else {0, member id, outcome, ...}: the slots
-- the ledger settled, which the caller writes to the result backend before Celery's chord_unlock joins the
-- chord. The check and the write are one step, so a member settled meanwhile either sees the parked call or
-- leaves nothing to park, and its outcome is read with the waiting set that no longer holds it.

if redis.call('SCARD', KEYS[1]) == 0 then
    local reply = {0}
    for _, item in ipairs(redis.call('HGETALL', KEYS[3])) do
        reply[#reply + 1] = item
    end
    return reply
end
redis.call('SET', KEYS[2], ARGV[1])
return {1}
