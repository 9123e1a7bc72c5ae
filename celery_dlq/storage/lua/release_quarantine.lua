-- release_quarantine.lua: move one raw element from a queue's quarantine to its dead-letter queue, wrapped as a dead letter.
--
-- KEYS[1] = quarantine     (LIST) raw elements that were not kombu messages
-- KEYS[2] = dead-letter queue list (LIST) kombu pushes on the left
-- ARGV[1] = the raw element, byte for byte
-- ARGV[2] = the dead letter (kombu's JSON, the raw element as its body)
-- Returns 1 when moved, 0 when the element was no longer in the quarantine.
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[2], ARGV[2])
return 1
