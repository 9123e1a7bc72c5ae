-- reject_invalid.lua: dead-letter a fetched message that cannot become a task: out of unacked, into its DLQ, in one step.
--
-- KEYS[1] = unacked        (HASH) kombu's: delivery tag -> JSON [message, exchange, routing key]
-- KEYS[2] = unacked_index  (ZSET) kombu's: delivery tag -> time fetched
-- KEYS[3] = fetched        (SET)  the consumer's fetched, unacked delivery tags
-- KEYS[4] = dead-letter queue list (LIST) kombu pushes on the left
-- ARGV[1] = delivery tag
-- ARGV[2] = the dead letter (kombu's JSON, the raw element as its body)
-- Returns 1 when moved, 0 when the tag was no longer unacked (restored or moved meanwhile).
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[1])
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('LPUSH', KEYS[4], ARGV[2])
return 1
