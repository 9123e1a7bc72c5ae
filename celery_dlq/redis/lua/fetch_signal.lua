-- fetch_signal.lua: the fetch listener heard writes to queue lists: mark the queues that hold a message.
-- An idle fetch blocks with BZPOPMIN on its queues' markers; a marker holds at most one member, so one
-- write wakes one idle worker (the one blocked longest), however many wait, as kombu's BRPOP does.
-- The woken worker's fetch takes the message; its pop is heard too, and marks the queue again if
-- another message is left, waking the next.
--
-- KEYS[1..k]     queue lists   (LIST) that were written to (each list of a queue, priority sub-lists too)
-- KEYS[k+1..2k]  wake markers  (ZSET) the marker of list i's queue (a marker may repeat)
-- Returns how many markers were written.
local k = #KEYS / 2
local written = 0
for i = 1, k do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    written = written + redis.call('ZADD', KEYS[k + i], 0, 'm')
  end
end
return written
