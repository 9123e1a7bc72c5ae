-- reject_invalid.lua: dead-letter a fetched message that cannot become a task: out of flight, into its DLQ, in one step.
--
-- KEYS[1] = in flight      (HASH) the consumer's fetched, unsettled messages (redis/inflight.py)
-- KEYS[2] = dead-letter queue list (LIST) kombu pushes on the left
-- ARGV[1] = delivery tag
-- ARGV[2] = the dead letter (kombu's JSON, the raw element as its body)
-- Returns 1 when moved, 0 when the tag was no longer in flight (given back or moved meanwhile).
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[2], ARGV[2])
return 1
