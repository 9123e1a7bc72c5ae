-- replay_move.lua: move one dead letter back to a queue, exactly once.
--
-- KEYS[1] = source  (LIST) the DLQ list (or priority sub-list) holding the dead letter
-- KEYS[2] = target  (LIST) the kombu queue list (or priority sub-list) it goes back to
--
-- ARGV[1] = the dead letter exactly as stored (kombu's JSON for the message)
-- ARGV[2] = the message to deliver (the dead letter rewritten for its replay)
--
-- Returns 1 when moved, 0 when the dead letter was no longer in the source
-- (replayed, purged or trimmed meanwhile): then nothing is pushed. Removing
-- and pushing in one script is what makes a replay interrupted between two
-- messages, and run again, deliver every message once: never lost, never twice.

if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then
    return 0
end
redis.call('LPUSH', KEYS[2], ARGV[2])
return 1
