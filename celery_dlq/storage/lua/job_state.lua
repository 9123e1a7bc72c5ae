-- job_state.lua: move a job from one of the states an action applies to into its next state.
--
-- KEYS[1] = job    (HASH) the job's record
-- KEYS[2] = lock   (STRING) the id of the unfinished job on its DLQ
-- KEYS[3] = leases (ZSET) job id -> lease expiry (ms), running jobs
--
-- ARGV[1] = the job id
-- ARGV[2] = the states the action applies to, comma-separated (storage/jobs.py TRANSITIONS)
-- ARGV[3] = the next state
-- ARGV[4] = "1" when the next state ends the job
-- ARGV[5] = seconds an ended job's record is kept
-- ARGV[6] = the owner that must hold the job ('' when any process may: pause, resume, cancel)
-- ARGV[7..] = field, value pairs to set with it
--
-- Returns {1, next state} when moved, {0, current state} when not ('' for no such job, or another owner).
-- Ending a job frees its DLQ's lock (if it holds it) and its lease entry, and lets its record expire.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {0, ''}
end
if ARGV[6] ~= '' and redis.call('HGET', KEYS[1], 'owner') ~= ARGV[6] then
  return {0, ''}
end
local allowed = false
for from in string.gmatch(ARGV[2], '[^,]+') do
  if from == state then allowed = true end
end
if not allowed then
  return {0, state}
end
redis.call('HSET', KEYS[1], 'state', ARGV[3])
for i = 7, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
if ARGV[4] == '1' then
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
  end
  lease_drop(KEYS[3], ARGV[1])   -- ended: nobody runs it (lib.lua)
  redis.call('EXPIRE', KEYS[1], ARGV[5])
end
return {1, ARGV[3]}
