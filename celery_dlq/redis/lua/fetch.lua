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
-- KEYS[2n+4..2n+11] (only with ARGV[3] > 0) the parked store's keys, as move_due.lua takes them
-- ARGV[1] = n, the number of queue lists
-- ARGV[2] = now, unix seconds (float), the unacked_index score
-- ARGV[3] = the most due parked entries moved onto these lists first (absent or 0: none): a busy
--           worker moves what came due for its own queues without waiting for the mover, as BullMQ's
--           moveToActive promotes delayed jobs (worker/fetch_moves.py); with move_due.lua's bookkeeping
-- ARGV[4] = now (ms), for the moves
-- ARGV[5] = the archive's MAXLEN (approximate); 0: no events
-- ARGV[6] = the events' time (integer microseconds)
-- ARGV[7] = the stats counter that counts the moves
-- Returns nil when every list is empty and nothing was moved, else {i, element, status, tag, queue,
-- task, n, ...}: status is "ok" (recorded under delivery tag `tag`), "quarantined" (moved to KEYS[n+i];
-- tag is "") or "none" (nothing popped; i is 0); then the moves per queue and task, as move_due.lua's.
local n = tonumber(ARGV[1])
local moves = {}
local limit = tonumber(ARGV[3] or '0')
if limit > 0 and #redis.call('ZRANGEBYSCORE', KEYS[2 * n + 4], '-inf', ARGV[4], 'LIMIT', 0, 1) > 0 then
  local lists = {}
  for i = 1, n do
    lists[KEYS[i]] = i
  end
  local _, _, per_task = move_due_entries(2 * n + 4, lists, ARGV[4], limit, tonumber(ARGV[5]), ARGV[6], ARGV[7])
  append_moves(moves, per_task)
end
local function reply(i, element, status, tag)
  local out = {i, element, status, tag}
  for _, v in ipairs(moves) do
    out[#out + 1] = v
  end
  return out
end
if #moves == 0 and redis.call('EXISTS', unpack(KEYS, 1, n)) == 0 then   -- every list empty (no key):
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
      return reply(i, element, 'ok', tag)
    end
    redis.call('LPUSH', KEYS[n + i], element)
    return reply(i, element, 'quarantined', '')
  end
end
if #moves > 0 then
  return reply(0, '', 'none', '')
end
return nil
