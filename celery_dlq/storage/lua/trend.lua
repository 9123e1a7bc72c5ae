-- trend.lua: count events in the trends' minute and hour rings (dead-lettered, redelivered; parks count in park.lua).
--
-- KEYS[1] = trends  (HASH) "<kind>|<dimension>|<name>|<m|h><slot>" -> "<minute|hour>:<count>" (lib.lua, trend_add)
--
-- ARGV[1] = the unix minute of the events
-- ARGV[2] = how many
-- ARGV[3], ARGV[4], ... = the series to count them in ("dead_lettered|queue|orders", ...)
--
-- Returns the number of series counted.

local minute, n = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do
    trend_add(KEYS[1], ARGV[i], minute, n)
end
return #ARGV - 2
