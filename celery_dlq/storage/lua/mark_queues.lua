-- mark_queues.lua: write the wake marker of each queue whose list holds a message, and arm the lists.
-- Run by the fetch listener on its tracking connection: every list this script reads is tracked for it
-- (Redis remembers the keys a script's commands read for the caller), so Redis sends one invalidation at
-- the list's next write, and none after until the listener reads the list again (worker/fetch_listener.py).
--
-- KEYS[1..n]      queue lists (LIST)
-- KEYS[n+1..2n]   the wake marker of list i's queue (ZSET, at most one member)
-- ARGV[1] = "1": mark every list's queue (a push was heard); "": only those whose list holds a message
-- Returns how many markers were written.
local n = #KEYS / 2
local marked = 0
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 or ARGV[1] == '1' then
    redis.call('ZADD', KEYS[n + i], 0, 'm')
    marked = marked + 1
  end
end
return marked
