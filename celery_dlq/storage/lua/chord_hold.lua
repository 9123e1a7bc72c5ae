-- chord_hold.lua: record a dead-lettered chord member in the chord ledger, in the state its rule gives it.
--
-- KEYS[1] = member   (HASH)   the letter's ledger entry (keys.chord_member): state, rule, dlq, group, context,
--                             at, member, fgroup
-- KEYS[2] = group    (SET)    the chord's waiting members (keys.chord_waiting)
-- KEYS[3] = dlq      (SET)    the waiting members dead-lettered to this DLQ (keys.chord_waiting_in)
-- KEYS[4] = unlock   (STRING) the chord's parked celery.chord_unlock call (keys.chord_unlock)
-- KEYS[5] = outcomes (HASH)   member id -> what its slot holds once settled (keys.chord_outcomes)
--
-- ARGV[1] = the dead letter's task id (the member's, or a step's of a chain ending in the member)
-- ARGV[2] = its new state: waiting (rule wait), failed (rule fail) or continued (rule continue)
-- ARGV[3] = its rule
-- ARGV[4] = its DLQ ('' when dropped)
-- ARGV[5] = its chord's group id
-- ARGV[6] = its request context (JSON: id, task, group, group_index, chord), to settle it later
-- ARGV[7] = now (unix seconds)
-- ARGV[8] = seconds a settled entry is kept
-- ARGV[9] = the chord member's task id (the part it stands for)
-- ARGV[10] = the letter's failure group (x-dlq-group), so the groups view counts the chords it holds open
-- ARGV[11] = what the member's slot holds under rules fail and continue (JSON; '' under wait): recorded in the
--            same step that stops the chord waiting, so a chord_unlock polling meanwhile joins it (chord_park_unlock)
--
-- Returns {the state it had before ('' when new), the parked chord_unlock call to send again ('' if none)}.
-- A member already settled (released, failed, continued) keeps its state: a chord is settled once, whatever
-- copy of the member fails later. A waiting entry never expires. Settling the chord's last waiting member
-- takes its parked chord_unlock call (chord_unlock backends).

local before = redis.call('HGET', KEYS[1], 'state') or ''
if before ~= '' and before ~= 'waiting' then
    return {before, ''}
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'rule', ARGV[3], 'dlq', ARGV[4], 'group', ARGV[5],
           'context', ARGV[6], 'at', ARGV[7], 'member', ARGV[9],
           'fgroup', ARGV[10])
local unlock = ''
if ARGV[2] == 'waiting' then
    redis.call('PERSIST', KEYS[1])
    redis.call('SADD', KEYS[2], ARGV[1])
    redis.call('SADD', KEYS[3], ARGV[1])
else
    redis.call('EXPIRE', KEYS[1], tonumber(ARGV[8]))
    redis.call('SREM', KEYS[2], ARGV[1])
    redis.call('SREM', KEYS[3], ARGV[1])
    if ARGV[11] ~= '' then
        redis.call('HSET', KEYS[5], ARGV[9], ARGV[11])
        redis.call('EXPIRE', KEYS[5], tonumber(ARGV[8]))
    end
    if redis.call('SCARD', KEYS[2]) == 0 then
        unlock = redis.call('GET', KEYS[4]) or ''
        redis.call('DEL', KEYS[4])
    end
end
return {before, unlock}
