-- mark_queues.lua: write the wake marker of each queue whose list holds a message, and arm the lists.
-- Run by the fetch listener on its tracking connection: every list this script reads is tracked for it
-- (Redis remembers the keys a script's commands read for the caller), so Redis sends one invalidation at
-- the list's next write, and none after until the listener reads the list again (worker/fetch/listener.py).
-- Where breakers hold in Redis, a list's oldest elements that an open breaker holds are kept first (as
-- fetch.lua keeps them), so a push of a held task wakes no worker.
--
-- KEYS[1..n]      queue lists (LIST)
-- KEYS[n+1..2n]   the wake marker of list i's queue (ZSET, at most one member)
-- KEYS[2n+1]      breaker holds (HASH) (only with ARGV[2]) <queue>\x1f<task> -> held until (ms)
-- KEYS[2n+2]      held deliveries (ZSET) (the same) <queue>\x1f<task>\x1f<element>, score 0
-- KEYS[2n+3]      kept totals (HASH) (the same) <queue>\x1f<task> -> deliveries kept
-- ARGV[1] = "1": a write was heard to every list (report those left unmarked); "": a look (report none)
-- ARGV[2] = now (ms) where breakers hold in Redis; absent or "" otherwise
-- ARGV[3..2+n] = (with ARGV[2]) the queue of list i
-- A queue is marked only where its list holds a message when the script runs: a write heard to a list
-- that is empty again was a pop, or a push another fetch took already; no worker needs waking for it.
-- Returns {how many markers were written, then the index of each list a write was heard to (ARGV[1] =
-- "1") that is not marked: a breaker kept all it held, or it was empty}.
local hold = ARGV[2] ~= nil and ARGV[2] ~= ''
local n = #KEYS / 2
if hold then
  n = (#KEYS - 3) / 2
  hold = redis.call('EXISTS', KEYS[2 * n + 1]) == 1   -- no breaker holds anything: no list to look into
end
local marked = 0
local kept = {}
for i = 1, n do
  local heard = ARGV[1] == '1'
  if hold then
    local now = tonumber(ARGV[2])
    for _ = 1, 100 do
      local oldest = redis.call('LINDEX', KEYS[i], -1)
      if not (oldest and breaker_keeps(KEYS[2 * n + 1], KEYS[2 * n + 2], KEYS[2 * n + 3], ARGV[2 + i],
                                       element_task(oldest),
                                       oldest, now)) then
        break
      end
      redis.call('RPOP', KEYS[i])
    end
  end
  -- Reading the list is also what arms its tracking for the next write.
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('ZADD', KEYS[n + i], 0, 'm')
    marked = marked + 1
  elseif heard then
    kept[#kept + 1] = i
  end
end
return {marked, unpack(kept)}
