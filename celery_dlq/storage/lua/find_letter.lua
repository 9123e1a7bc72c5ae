-- find_letter.lua: the dead letters in a range of a list whose text contains a needle (a task id).
--
-- KEYS[1] = list (LIST) a DLQ list
--
-- ARGV[1] = needle (plain text, no pattern)
-- ARGV[2] = first index (LRANGE's)
-- ARGV[3] = last index (LRANGE's, inclusive)
--
-- Returns {index, element, index, element, ...} of the candidates, for the caller to decode and check.
-- Searching inside Redis sends back the few candidates instead of every letter in the range.

local first = tonumber(ARGV[2])
local found = {}
local items = redis.call('LRANGE', KEYS[1], first, tonumber(ARGV[3]))
for i, raw in ipairs(items) do
    if string.find(raw, ARGV[1], 1, true) then
        found[#found + 1] = first + i - 1
        found[#found + 1] = raw
    end
end
return found
