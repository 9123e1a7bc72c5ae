-- job_create.lua: record a new job, unless another unfinished job holds its DLQ (one job per DLQ).
--
-- KEYS[1] = job    (HASH) the new job's record
-- KEYS[2] = lock   (STRING) the id of the unfinished job on this DLQ
-- KEYS[3] = jobs   (ZSET) job id -> created (s), every job kept
-- KEYS[4] = leases (ZSET) job id -> lease expiry (ms), running jobs
-- KEYS[5] = holder (HASH) the record of the job the lock named when read (ARGV[5]; any job's key when none)
--
-- ARGV[1] = the job id
-- ARGV[2] = "force" to create it even when the DLQ is held
-- ARGV[3] = created (s)
-- ARGV[4] = how many jobs the index keeps
-- ARGV[5] = the id the lock held when read ('' for none)
-- ARGV[6..] = field, value pairs of the record
--
-- Returns {1, job id} when created, {0, holder's id} when another unfinished job holds the DLQ, {-1, ''}
-- when the lock changed since it was read (read it again and retry: KEYS[5] must be its job's). A lock
-- whose job has ended or expired is free. A job is created running with no owner (lease 0): any runner
-- may take it.
local holder = redis.call('GET', KEYS[2])
if (holder or '') ~= ARGV[5] then
  return {-1, ''}
end
if holder and holder ~= ARGV[1] and ARGV[2] ~= 'force' then
  local state = redis.call('HGET', KEYS[5], 'state')
  if state == 'running' or state == 'paused' then
    return {0, holder}
  end
end
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
if ARGV[2] ~= 'force' or not holder then
  redis.call('SET', KEYS[2], ARGV[1])
end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
lease_hold(KEYS[4], ARGV[1], 0)   -- no owner yet: a lease that expired, taken by the first claim (lib.lua)
local keep = tonumber(ARGV[4])
if redis.call('ZCARD', KEYS[3]) > keep then
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -keep - 1)
end
return {1, ARGV[1]}
