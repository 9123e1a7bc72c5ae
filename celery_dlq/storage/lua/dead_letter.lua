-- dead_letter.lua: push a dead letter onto its DLQ and count it in the DLQ's failure group, in one step.
--
-- KEYS[1] = dlq     (LIST) the DLQ list (the priority sub-list of the letter's priority); kombu pushes on the left
-- KEYS[2] = groups  (HASH) the DLQ's failure groups (fields: lib.lua, group_add)
--
-- ARGV[1] = the dead letter (kombu's JSON, as kombu's Redis transport would have pushed it)
-- ARGV[2] = its group id (its x-dlq-group header)
-- ARGV[3] = its reason (x-dlq-reason)
-- ARGV[4] = its x-dlq-dead-lettered-at (unix seconds)
-- ARGV[5] = that time in unix hours (the sparkline's bucket)
-- ARGV[6] = the group's description (JSON: task, exception type, title, sample)
--
-- Returns the DLQ list's length. A worker killed before the script leaves no letter and no count;
-- after it, both: the count never drifts from the list.

local length = redis.call('LPUSH', KEYS[1], ARGV[1])
group_add(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return length
