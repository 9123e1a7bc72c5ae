-- heartbeat.lua: a worker says it is alive, and takes or keeps the mover lease.
--
-- KEYS[1] = lease    (STRING) the id of the one worker that moves due entries and runs the fetch
--                    listener; expires after ARGV[2] ms unless renewed
-- KEYS[2] = workers  (ZSET) worker id -> its last heartbeat (ms)
--
-- ARGV[1] = this worker's id
-- ARGV[2] = the lease's time to live (ms): dlq_mover_lease minus one heartbeat interval, so that a
--           survivor's next heartbeat takes a dead holder's lease within dlq_mover_lease of its death
-- ARGV[3] = now (ms)
-- ARGV[4] = how long a silent worker stays in `workers` (ms)
-- ARGV[5] = "release" to give the lease up and leave `workers` (a worker stopping), "" otherwise
--
-- Every worker beats every interval, so whoever of them is alive takes a free lease at its next beat:
-- no standby whose death would delay the takeover. Returns 1 when this worker holds the lease (taken now
-- or renewed), 0 when another does, 3 after a release.
local id = ARGV[1]
local holder = redis.call('GET', KEYS[1])
if ARGV[5] == 'release' then
  if holder == id then
    redis.call('DEL', KEYS[1])
  end
  redis.call('ZREM', KEYS[2], id)
  return 3
end
redis.call('ZADD', KEYS[2], ARGV[3], id)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[4]))
if holder == id or not holder then
  redis.call('SET', KEYS[1], id, 'PX', ARGV[2])
  return 1
end
return 0
