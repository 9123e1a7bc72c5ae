-- fetch.lua: pop the next message of a worker's queues and record it as in flight, in one step.
-- kombu's BRPOP and its unacked write are two round trips: a message popped
-- but not yet recorded is lost if the worker dies or Redis restarts between
-- them. Here nothing is popped without being recorded, and a list element
-- that is not a kombu message is moved to its queue's quarantine, never lost.
-- The record is the consumer's own (its in-flight hash, given back when its
-- heartbeat stops: redis/inflight.py), not kombu's unacked hash, so kombu's
-- visibility timeout never gives a live worker's message to another.
--
-- KEYS[1] = the first queue list (LIST), where most messages are: before Redis 7, popped first
-- KEYS[1..n]          queue lists      (LIST) in priority order, as kombu's BRPOP takes them
-- KEYS[n+1..2n]       quarantines      (LIST) raw elements of list i that are not kombu messages
-- KEYS[2n+1]          in flight        (HASH) this consumer's: delivery tag -> in_flight_value (lib.lua)
-- KEYS[2n+2]          consumers        (ZSET) consumer -> last heartbeat (ms)
-- KEYS[2n+3..2n+2+m]  wake markers     (ZSET) one per queue, at most one member: the fetch listener writes it
--                                      when the queue's lists hold a message; an idle fetch blocks on them
-- KEYS[2n+3+m]        fetch queues     (ZSET) queue -> when a fetch registered it (ms): what the listener hears
-- KEYS[2n+4+m]        listening        (SET)  the queues a live fetch listener hears
-- KEYS[2n+5+m]        breaker holds (HASH)  (only with ARGV[6+m] = "1") <queue>\x1f<task> -> held until (ms)
-- KEYS[2n+6+m]        held deliveries (ZSET) (the same) <queue>\x1f<task>\x1f<element>, score 0
-- KEYS[2n+7+m]        kept totals (HASH) (the same) <queue>\x1f<task> -> deliveries kept (breaker_held_total)
-- KEYS[..]            (only with a move limit > 0) the parked store's keys, as move_due.lua takes them
-- ARGV[1] = n, the number of queue lists
-- ARGV[2] = this consumer: written to KEYS[2n+2] with ARGV[4] when a message is taken ("": its heartbeat
--           is recent, nothing to write)
-- ARGV[3] = m, the number of wake markers (0: no fetch listener, the channel waits its own way)
-- ARGV[4] = now (ms)
-- ARGV[5] = "1": register the queues again (their score), as each channel does every few minutes
-- ARGV[6..5+m]   the queue of each marker (members of the fetch queues and listening sets)
-- ARGV[6+m]      "1": hold in Redis what an open circuit breaker holds (then ARGV[7+m..6+m+n]: the queue of
--                each list); a held delivery never reaches a worker: it is kept in the held deliveries, and
--                the next list element is popped instead (at most HOLD_MAX per call)
-- ARGV[e+1]      (e = 6+m, or 6+m+n with holds) the most due parked entries moved onto these lists first (0:
--                none): a busy worker moves what came due for its own queues without waiting for the mover, as
--                BullMQ's moveToActive promotes delayed jobs (worker/fetch_moves.py); with move_due.lua's bookkeeping
-- ARGV[e+2]      the archive's MAXLEN (approximate); 0: no events
-- ARGV[e+3]      the events' time (integer microseconds)
-- ARGV[e+4]      the stats counter that counts the moves
-- Returns, when every list is empty and nothing was moved: 0 when a listener hears every one of these
-- queues (the channel then blocks on the markers), nil otherwise (it waits without them). Else {i,
-- element, status, tag, more, queue, task, n, ...}: status is "ok" (recorded under delivery tag `tag`),
-- "again" (the same, for a message given back by a lost consumer: a redelivery), "quarantined" (moved
-- to KEYS[n+i]; tag is "") or "none" (nothing handed over: i is 0; deliveries moved or held); more is 1
-- when a list still holds a message after this pop; then the moves per queue and task.
local n = tonumber(ARGV[1])
local m = tonumber(ARGV[3])
local marks = 2 * n + 3   -- the first wake marker
local hold = ARGV[6 + m] == '1'
local holds = marks + m + 2
local extra = 6 + m
local store = holds
if hold then
  extra = extra + n
  store = store + 3
end
local moves = {}
local limit = tonumber(ARGV[extra + 1] or '0')
local HOLD_MAX = 100
if limit > 0 and #redis.call('ZRANGEBYSCORE', KEYS[store], '-inf', ARGV[4], 'LIMIT', 0, 1) > 0 then
  local lists = {}
  for i = 1, n do
    lists[KEYS[i]] = i
  end
  local _, _, per_task = move_due_entries(store, lists, ARGV[4], limit, tonumber(ARGV[extra + 2]),
                                          ARGV[extra + 3], ARGV[extra + 4])
  append_moves(moves, per_task)
end
local function reply(i, element, status, tag)
  local more = 0
  if redis.call('EXISTS', unpack(KEYS, 1, n)) > 0 then
    more = 1
  end
  local out = {i, element, status, tag, more}
  for _, v in ipairs(moves) do
    out[#out + 1] = v
  end
  return out
end
local function register()   -- the listener hears the queues of the fetch queues set (it is told of new ones)
  local args = {}
  for j = 1, m do
    args[#args + 1] = ARGV[4]
    args[#args + 1] = ARGV[5 + j]
  end
  if redis.call('ZADD', KEYS[marks + m], unpack(args)) > 0 then
    redis.call('PUBLISH', KEYS[marks + m], 'new')
  end
end
local function empty()
  if m == 0 then
    return nil
  end
  -- Empty now, so any marker of these queues is stale: the next push writes it again.
  redis.call('DEL', unpack(KEYS, marks, marks + m - 1))
  local heard = redis.call('SMISMEMBER', KEYS[marks + m + 1], unpack(ARGV, 6, 5 + m))
  for j = 1, m do
    if heard[j] == 0 then
      register()
      return nil
    end
  end
  if ARGV[5] == '1' then
    register()
  end
  return 0
end
-- The reply for list i's element, or nil when a breaker held it.
local function take(i, element)
  local raw = element
  local status = 'ok'
  if string.sub(element, 1, #GIVEN_BACK) == GIVEN_BACK then   -- given back by a lost consumer (lib.lua)
    element = '{' .. string.sub(element, #GIVEN_BACK + 1)
    status = 'again'
  end
  local ok, message = pcall(cjson.decode, element)
  local properties = ok and type(message) == 'table' and message['properties']
  local tag = type(properties) == 'table' and properties['delivery_tag']
  local info = type(properties) == 'table' and properties['delivery_info']
  if type(tag) == 'string' and tag ~= '' and type(info) == 'table'
      and type(info['exchange']) == 'string' and type(info['routing_key']) == 'string' then
    local headers = message['headers']
    if hold and type(headers) == 'table' and breaker_keeps(KEYS[holds], KEYS[holds + 1], KEYS[holds + 2],
                                                           ARGV[6 + m + i],
                                                           headers['task'], raw, tonumber(ARGV[4])) then
      return nil
    end
    redis.call('HSET', KEYS[2 * n + 1], tag, in_flight_value(KEYS[i], element))
    if ARGV[2] ~= '' then
      redis.call('ZADD', KEYS[2 * n + 2], ARGV[4], ARGV[2])
    end
    return reply(i, element, status, tag)
  end
  redis.call('LPUSH', KEYS[n + i], element)
  return reply(i, element, 'quarantined', '')
end
-- One LMPOP takes from the first list that holds a message (Redis >= 7): one command wherever the message
-- is, and for an empty fetch. Before 7: the first list first (where most messages are), then one EXISTS
-- for the rest, and RPOP down the lists.
local function pop()
  if redis.REDIS_VERSION_NUM and redis.REDIS_VERSION_NUM >= 0x070000 then
    local key_args = {n}   -- LMPOP numkeys key ... RIGHT: the keys are KEYS[1..n]
    local index = {}
    for i = 1, n do
      key_args[i + 1] = KEYS[i]
      index[KEYS[i]] = i
    end
    key_args[n + 2] = 'RIGHT'
    local popped = redis.call('LMPOP', unpack(key_args))
    if popped then
      return index[popped[1]], popped[2][1]
    end
    return nil
  end
  local first = redis.call('RPOP', KEYS[1])
  if first then
    return 1, first
  end
  if n > 1 and redis.call('EXISTS', unpack(KEYS, 2, n)) > 0 then
    for i = 2, n do
      local element = redis.call('RPOP', KEYS[i])
      if element then
        return i, element
      end
    end
  end
  return nil
end
local kept = 0
while kept < HOLD_MAX do
  local i, element = pop()
  if not i then
    break
  end
  local out = take(i, element)
  if out then
    return out
  end
  kept = kept + 1
end
if kept > 0 then
  return reply(0, '', 'none', '')
end
if #moves > 0 then
  return {0, '', 'none', '', 0, unpack(moves)}
end
return empty()
