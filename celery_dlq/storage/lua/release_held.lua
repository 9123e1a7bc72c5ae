-- release_held.lua: push deliveries fetch.lua held for an open breaker back onto a list of their queue.
--
-- KEYS[1] = held deliveries (ZSET) every score 0: <queue>\x1f<task>\x1f<list element>
-- KEYS[2] = the list they go back to (LIST) kombu's list of their queue, the lowest priority: other traffic first
-- ARGV[1] = <queue>\x1f<task>\x1f: the prefix of the deliveries to release
-- ARGV[2] = at most this many
-- Returns how many were pushed: each is taken off the held set in the same step, so none is lost or doubled.
local prefix = ARGV[1]
local members = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', 0,
                           tonumber(ARGV[2]))
for _, member in ipairs(members) do
  redis.call('LPUSH', KEYS[2], string.sub(member, #prefix + 1))
end
if #members > 0 then
  redis.call('ZREM', KEYS[1], unpack(members))
end
return #members
