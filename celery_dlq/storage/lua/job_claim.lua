-- job_claim.lua: take an unfinished job whose owner's lease expired (or which has none), or renew one's own.
--
-- KEYS[1] = job    (HASH) the job's record (owner, lease_until (ms), state, progress counts)
-- KEYS[2] = leases (ZSET) job id -> lease expiry (ms), unfinished jobs
--
-- ARGV[1] = the job id
-- ARGV[2] = the claiming process
-- ARGV[3] = now (ms)
-- ARGV[4] = the lease's length (ms)
-- ARGV[5] = "take" to take an orphan, "renew" to renew one's own lease only
-- ARGV[6..] = field, increment pairs: the owner's progress since its last claim (HINCRBY)
--
-- Returns the job's state when this process holds it now (its lease renewed to now + length), '' when
-- not: another process's lease runs, or the job has ended. The owner's progress is counted even when
-- the job was cancelled meanwhile (its last batch did move); a runner that lost the job to a takeover
-- counts nothing and learns it here, at its next batch.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return ''
end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[2] then
  for i = 6, #ARGV, 2 do
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if state ~= 'running' and state ~= 'paused' then
  return ''
end
local now = tonumber(ARGV[3])
if owner ~= ARGV[2] then
  if ARGV[5] ~= 'take' or lease_live(KEYS[2], ARGV[1], now + 1) then   -- live: expires after now (lib.lua)
    return ''
  end
  redis.call('HSET', KEYS[1], 'owner', ARGV[2])
  if owner and owner ~= '' then
    redis.call('HINCRBY', KEYS[1], 'takeovers', 1)
  end
end
local until_ms = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'lease_until', until_ms)
lease_hold(KEYS[2], ARGV[1], until_ms)
return state
