-- give_back.lua: give a consumer's in-flight messages back to the lists they came from, byte for byte.
-- Used for a consumer whose beats stopped (the sweeper), for a previous run of a restarted worker,
-- and by a consumer for its own messages (close, requeue, a lost connection). Only what is still in the
-- consumer's hash goes back, so a consumer whose messages were taken over settles nothing of another's.
--
-- KEYS[1] = in flight  (HASH) the consumer's: delivery tag -> in_flight_value (lib.lua)
-- KEYS[2] = consumers  (ZSET) consumer -> last beat (ms): each beat starts a lease (lib.lua, lease_*)
-- KEYS[3..] the lists the messages go back to
--
-- ARGV[1] = the consumer (its member in KEYS[2])
-- ARGV[2] = cutoff (ms): give back only if the consumer's last beat is older ("": no check)
-- ARGV[3] = "left": LPUSH, behind what waits (kombu's requeue); "right": RPUSH, delivered next
-- ARGV[4] = "1": forget the consumer in KEYS[2] once its hash is empty (it is gone)
-- ARGV[5], ARGV[6], ... = delivery tag, the index in KEYS of its list; as many pairs as messages
--
-- Each message goes back marked GIVEN_BACK (lib.lua), so the next fetch counts the delivery.
-- Returns how many went back, or -1 when the consumer beat after the cutoff (nothing done).
if ARGV[2] ~= '' and lease_live(KEYS[2], ARGV[1], ARGV[2]) then
  return -1
end
local push = ARGV[3] == 'left' and 'LPUSH' or 'RPUSH'
local given = 0
for i = 5, #ARGV, 2 do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  if value then
    local colon = string.find(value, ':', 1, true)
    local length = tonumber(string.sub(value, 1, colon - 1))
    local list = string.sub(value, colon + 1, colon + length)
    local key = KEYS[tonumber(ARGV[i + 1])]
    if list == key then
      local element = string.sub(value, colon + length + 1)
      local open = string.find(element, '{', 1, true)
      redis.call(push, key, GIVEN_BACK .. string.sub(element, open + 1))
      redis.call('HDEL', KEYS[1], ARGV[i])
      given = given + 1
    end
  end
end
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then
  lease_drop(KEYS[2], ARGV[1])   -- gone: its beats' lease with it (lib.lua)
end
return given
