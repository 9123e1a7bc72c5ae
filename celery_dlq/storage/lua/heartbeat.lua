-- heartbeat.lua: the holder of the mover lease checks that it still holds it, and renews or gives it up.
--
-- KEYS[1] = lease  (STRING) the id of the one worker that moves due entries and runs the fetch listener
--
-- ARGV[1] = this worker's id
-- ARGV[2] = the lease's time to live (ms)
-- ARGV[3] = "renew" or "release"
--
-- A worker takes a free lease with SET NX PX (no script); this script is the holder's check, run every
-- few beats (the beats between renew with a plain PEXPIRE). Returns 1 when this worker held the lease
-- (renewed, or released), 0 when another worker holds it or nobody does.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == 'release' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
