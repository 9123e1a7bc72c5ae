-- chord_dying.lua: count a chord member as waiting while its last failure is raised, unless its chord is settled.
--
-- KEYS[1] = member (HASH) the member's ledger entry (keys.chord_member)
-- KEYS[2] = group  (SET)  the chord's waiting members (keys.chord_waiting)
--
-- ARGV[1] = the member's task id
--
-- Returns 1 when the member counts as waiting now (a polling chord_unlock parks until its rule is applied),
-- 0 when its ledger entry was settled already (released, failed, continued): a later copy of a settled member
-- that fails (a duplicate delivery) must not hold its chord open again, as nothing would ever settle it.

local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'waiting' then
    return 0
end
redis.call('SADD', KEYS[2], ARGV[1])
return 1
