-- login_take.lua: take one login try for a client address, then (only if the address had one left) for a user.
--
-- KEYS[1] = address (STRING) failed-login counter of the client address, expiring (Keys.web_login_failures)
-- KEYS[2] = user    (STRING) failed-login counter of the user name, expiring (absent: no per-user count)
--
-- ARGV[1] = the limit of tries per window
-- ARGV[2] = the window, in seconds, from the first try
--
-- Returns 1 when the try may be checked, 0 when refused. The address's budget is checked first: a try it
-- refuses writes no key for the user, so an anonymous client cannot make a key per user name it invents.
local limit = tonumber(ARGV[1])
-- A counter's window starts at its first try (its INCR from nothing sets the expiry).
local tries = redis.call('INCR', KEYS[1])
if tries == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
if tries > limit then
  return 0
end
if KEYS[2] then
  tries = redis.call('INCR', KEYS[2])
  if tries == 1 then
    redis.call('EXPIRE', KEYS[2], ARGV[2])
  end
  if tries > limit then
    return 0
  end
end
return 1
