-- remove_letters.lua: delete a batch of dead letters by exact value (purge, retention) and uncount them.
--
-- KEYS[1] = groups  (HASH) the DLQ's failure groups (lib.lua, group_remove)
-- KEYS[2..] = lists  (LIST) the DLQ's lists the letters are in
--
-- ARGV, four per dead letter: its list (index into KEYS), the dead letter exactly as stored,
--   its group id ('' when it has none), its reason
--
-- Returns one 1 (deleted) or 0 (gone already) per dead letter.

local removed = {}
for i = 1, #ARGV, 4 do
    local list = tonumber(ARGV[i])
    if redis.call('LREM', KEYS[list], -1, ARGV[i + 1]) == 0 then
        removed[#removed + 1] = 0
    else
        group_remove(KEYS[1], ARGV[i + 2], ARGV[i + 3])
        removed[#removed + 1] = 1
    end
end
return removed
