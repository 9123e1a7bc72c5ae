-- replay_batch.lua: move a batch of dead letters back to their queues, each exactly once, and uncount them.
--
-- KEYS[1] = groups  (HASH) the DLQ's failure groups (lib.lua, group_remove)
-- KEYS[2..] = lists  (LIST) the DLQ's lists the letters are in and the queue lists they go to, each once
--
-- ARGV, six per dead letter:
--   source list (index into KEYS), target list (index into KEYS),
--   the dead letter exactly as stored, the message to deliver (the letter rewritten for its replay),
--   its group id ('' when it has none), its reason
--
-- Returns one 1 (moved) or 0 (no longer in the DLQ: replayed, purged or trimmed meanwhile; nothing
-- pushed) per dead letter. Each letter is removed, pushed and uncounted together, so a replay killed
-- anywhere and run again delivers every letter once: the batch is one script, never half done.

local moved = {}
for i = 1, #ARGV, 6 do
    local source, target = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    if redis.call('LREM', KEYS[source], -1, ARGV[i + 2]) == 0 then
        moved[#moved + 1] = 0
    else
        redis.call('LPUSH', KEYS[target], ARGV[i + 3])
        group_remove(KEYS[1], ARGV[i + 4], ARGV[i + 5])
        moved[#moved + 1] = 1
    end
end
return moved
