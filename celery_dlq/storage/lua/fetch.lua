-- fetch.lua: pop the next message of a worker's queues and record it as in flight, in one step.
-- kombu's BRPOP and its unacked write are two round trips: a message popped
-- but not yet recorded is lost if the worker dies or Redis restarts between
-- them. Here nothing is popped without being recorded, and a list element
-- that is not a kombu message is moved to its queue's quarantine, never lost.
-- The record is the consumer's own (its in-flight hash, given back when its
-- heartbeat stops: redis/inflight.py), not kombu's unacked hash, so kombu's
-- visibility timeout never gives a live worker's message to another.
--
-- KEYS and ARGV are composed from declared sections (storage/fetch.py, SECTIONS), each of which may be absent,
-- located by a header. No offset is computed here.
-- ARGV[1] = the header: 16-bit big-endian numbers, two per section in the order of the `local CLOCK, LISTS, ...`
--           line below (its first key, its first argument), then one past the last key and past the last argument
-- KEYS[1] = the first queue list (LIST), where most messages are: before Redis 7, popped first
-- clock        ARGV  now (ms)
-- lists        KEYS  the queue lists (LIST) in priority order, as kombu's BRPOP takes them: KEYS[1..n], the first
--                    (where most messages are) popped first before Redis 7
-- quarantines  KEYS  the raw elements of list i that are not kombu messages (LIST), at its i-th key
-- inflight     KEYS  this consumer's in flight (HASH: delivery tag -> in_flight_value, lib.lua), the consumers
--                    (ZSET: consumer -> last beat, ms)
--              ARGV  this consumer: written to the consumers with now when a message is taken ("": its beat is
--                    recent, nothing to write)
-- markers      KEYS  one wake marker per queue (ZSET, at most one member): the fetch listener writes it when the
--                    queue's lists hold a message; an idle fetch blocks on them. Absent: no fetch listener, the
--                    channel waits its own way
--              ARGV  the queue of each marker (members of the fetch queues and listening sets)
-- listener     KEYS  fetch queues (ZSET: queue -> when a fetch registered it, ms: what the listener hears), listening
--                    (SET: the queues a live fetch listener hears); present with the markers
--              ARGV  "1": register the queues again (their score), as each channel does every few minutes
-- holds        KEYS  breaker holds (HASH: <queue>\x1f<task> -> held until, ms), held deliveries (ZSET:
--                    <queue>\x1f<task>\x1f<element>, score 0), kept totals (HASH: <queue>\x1f<task> -> deliveries kept)
--              ARGV  the queue of each list. Present: hold in Redis what an open circuit breaker holds; a held
--                    delivery never reaches a worker: it is kept in the held deliveries, and the next list element
--                    is popped instead (at most HOLD_MAX per call)
-- moves        KEYS  the parked store's keys, as move_due.lua takes them
--              ARGV  the most due parked entries moved onto these lists first, the archive's MAXLEN (approximate;
--                    0: no events), the events' time (integer microseconds), the stats counter that counts the
--                    moves. Present: a busy worker moves what came due for its own queues without waiting for the
--                    mover, as BullMQ's moveToActive promotes delayed jobs (worker/fetch/moves.py); with
--                    move_due.lua's bookkeeping
-- Returns, when every list is empty and nothing was moved: 0 when a listener hears every one of these
-- queues (the channel then blocks on the markers), nil otherwise (it waits without them). Else {i,
-- element, status, tag, more, queue, task, n, ...}: status is "ok" (recorded under delivery tag `tag`),
-- "again" (the same, for a message given back by a lost consumer: a redelivery), "quarantined" (moved
-- to list i's quarantine; tag is "") or "none" (nothing handed over: i is 0; deliveries moved or held); more
-- is 1 when a list still holds a message after this pop; then the moves per queue and task.
-- The sections, in the header's order; K[s] is section s's first key, A[s] its first argument, and its counts are
-- the next section's firsts minus its own (K[9], A[9]: one past the last key and argument).
local CLOCK, LISTS, QUARANTINES, INFLIGHT, MARKERS, LISTENER, HOLDS, MOVES = 1, 2, 3, 4, 5, 6, 7, 8
local h = {string.byte(ARGV[1], 1, -1)}   -- a binary string: one string.byte, no tonumber per number
local K, A = {0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0}
for s = 1, 9 do
  K[s], A[s] = h[4 * s - 3] * 256 + h[4 * s - 2], h[4 * s - 1] * 256 + h[4 * s]
end
if K[LISTS] ~= 1 then
  return redis.error_reply('fetch.lua: the lists must be KEYS[1..n]')
end
local now = ARGV[A[CLOCK]]
local n = K[LISTS + 1] - K[LISTS]
local m = K[MARKERS + 1] - K[MARKERS]
local marks = K[MARKERS]   -- the first wake marker
local hold = K[HOLDS + 1] > K[HOLDS]
local holds = K[HOLDS]
local store = K[MOVES]
local moves = {}
local limit = A[MOVES + 1] > A[MOVES] and tonumber(ARGV[A[MOVES]]) or 0
local HOLD_MAX = 100
if limit > 0 and #redis.call('ZRANGEBYSCORE', KEYS[store], '-inf', now, 'LIMIT', 0, 1) > 0 then
  local lists = {}
  for i = 1, n do
    lists[KEYS[i]] = i
  end
  local _, _, per_task = move_due_entries(store, lists, now, limit, tonumber(ARGV[A[MOVES] + 1]),
                                          ARGV[A[MOVES] + 2], ARGV[A[MOVES] + 3])
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
    args[#args + 1] = now
    args[#args + 1] = ARGV[A[MARKERS] + j - 1]
  end
  if redis.call('ZADD', KEYS[K[LISTENER]], unpack(args)) > 0 then
    redis.call('PUBLISH', KEYS[K[LISTENER]], 'new')
  end
end
local function empty()
  if m == 0 then
    return nil
  end
  -- Empty now, so any marker of these queues is stale: the next push writes it again.
  redis.call('DEL', unpack(KEYS, marks, marks + m - 1))
  local heard = redis.call('SMISMEMBER', KEYS[K[LISTENER] + 1], unpack(ARGV, A[MARKERS], A[MARKERS] + m - 1))
  for j = 1, m do
    if heard[j] == 0 then
      register()
      return nil
    end
  end
  if ARGV[A[LISTENER]] == '1' then
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
                                                           ARGV[A[HOLDS] + i - 1],
                                                           headers['task'], raw, tonumber(now)) then
      return nil
    end
    redis.call('HSET', KEYS[K[INFLIGHT]], tag, in_flight_value(KEYS[i], element))
    if ARGV[A[INFLIGHT]] ~= '' then
      lease_hold(KEYS[K[INFLIGHT] + 1], ARGV[A[INFLIGHT]], now)   -- the consumer's beat starts its lease again (lib.lua)
    end
    return reply(i, element, status, tag)
  end
  redis.call('LPUSH', KEYS[K[QUARANTINES] + i - 1], element)
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
