-- fetch.lua: pop the next message of a worker's queues and record it as unacknowledged, in one step.
-- kombu's BRPOP and its unacked write are two round trips: a message popped
-- but not yet recorded is lost if the worker dies or Redis restarts between
-- them. Here nothing is popped without being recorded, and a list element
-- that is not a kombu message is moved to its queue's quarantine, never lost.
--
-- KEYS[1..n]      queue lists      (LIST) in priority order, as kombu's BRPOP takes them
-- KEYS[n+1..2n]   quarantines      (LIST) raw elements of list i that are not kombu messages
-- KEYS[2n+1]      unacked          (HASH) kombu's: delivery tag -> JSON [message, exchange, routing key]
-- KEYS[2n+2]      unacked_index    (ZSET) kombu's: delivery tag -> time fetched (s)
-- KEYS[2n+3]      fetched          (SET)  delivery tags this consumer fetched and has not acked
-- ARGV[1] = n, the number of queue lists
-- ARGV[2] = now, unix seconds (float), the unacked_index score
-- Returns nil when every list is empty, else {i, element, status, tag}: status
-- is "ok" (recorded under delivery tag `tag`) or "quarantined" (moved to
-- KEYS[n+i]; tag is "").
local n = tonumber(ARGV[1])
if redis.call('EXISTS', unpack(KEYS, 1, n)) == 0 then   -- every list empty (an empty list has no key):
  return nil                                           -- one command, not one RPOP per list
end
for i = 1, n do
  local element = redis.call('RPOP', KEYS[i])
  if element then
    local ok, message = pcall(cjson.decode, element)
    local properties = ok and type(message) == 'table' and message['properties']
    local tag = type(properties) == 'table' and properties['delivery_tag']
    local info = type(properties) == 'table' and properties['delivery_info']
    if type(tag) == 'string' and tag ~= '' and type(info) == 'table'
        and type(info['exchange']) == 'string' and type(info['routing_key']) == 'string' then
      -- The element is kept byte for byte: kombu's restore decodes [M, EX, RK].
      local record = '[' .. element .. ',' .. cjson.encode(info['exchange']) .. ','
                     .. cjson.encode(info['routing_key']) .. ']'
      redis.call('HSET', KEYS[2 * n + 1], tag, record)
      redis.call('ZADD', KEYS[2 * n + 2], ARGV[2], tag)
      redis.call('SADD', KEYS[2 * n + 3], tag)
      return {i, element, 'ok', tag}
    end
    redis.call('LPUSH', KEYS[n + i], element)
    return {i, element, 'quarantined', ''}
  end
end
return nil
