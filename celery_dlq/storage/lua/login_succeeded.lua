-- login_succeeded.lua: a right password: the address's try given back, the user's count gone.
--
-- KEYS[1] = address (STRING) failed-login counter of the client address, expiring (Keys.web_login_failures)
-- KEYS[2] = user    (STRING) failed-login counter of the user name, expiring
--
-- No ARGV. The address's count never goes below 0 and keeps its expiry (its window); returns nothing.
redis.call('DEL', KEYS[2])
local count = tonumber(redis.call('GET', KEYS[1]))
if count and count > 0 then
  redis.call('DECR', KEYS[1])
end
return 1
