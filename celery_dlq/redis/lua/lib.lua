-- lib.lua: prepended to every script by scripts.py (one definition of the parked payload formats).
--
-- A parked payload is one of:
--   publish format: JSON {"v": 1, "body": <base64>, ...} (Envelope.dumps); its queue is in the `queues`
--                   hash; a mover decodes it and publishes it through kombu (any broker);
--   direct format:  "\1" .. queue .. "\0" .. destination list key .. "\0" .. task name .. "\0" .. element,
--                   where element is the exact JSON kombu's Redis transport pops from that list; it has no
--                   `queues` field and move_due.lua LPUSHes it inside Redis.
local function direct_parts(payload)
    if not payload or string.byte(payload, 1) ~= 1 then
        return nil
    end
    local a = string.find(payload, '\0', 2, true)
    local b = a and string.find(payload, '\0', a + 1, true)
    local c = b and string.find(payload, '\0', b + 1, true)
    if not c then
        return nil
    end
    return {queue = string.sub(payload, 2, a - 1), dest = string.sub(payload, a + 1, b - 1),
            task = string.sub(payload, b + 1, c - 1), element = string.sub(payload, c + 1)}
end

-- The queue an entry is parked for: its `queues` field (publish format) or its payload (direct format).
local function parked_queue(queues_key, id, payload)
    local queue = redis.call('HGET', queues_key, id)
    if queue then
        return queue
    end
    local parts = direct_parts(payload)
    return parts and parts.queue
end

-- Leases that expired (their mover died or stalled between claim and ack) become due again, scored now.
local function restore_expired_leases(delayed_key, leases_key, now, limit)
    local expired = redis.call('ZRANGEBYSCORE', leases_key, '-inf', now, 'LIMIT', 0, limit)
    for _, id in ipairs(expired) do
        redis.call('ZREM', leases_key, id)
        redis.call('ZADD', delayed_key, now, id)
    end
end

-- A due entry whose payload is gone cannot be delivered: delete it and take it off its queue's count.
local function forget_entry(delayed_key, queues_key, parked_key, expiries_key, id)
    redis.call('ZREM', delayed_key, id)
    redis.call('HDEL', expiries_key, id)
    local queue = redis.call('HGET', queues_key, id)
    redis.call('HDEL', queues_key, id)
    if queue and redis.call('HINCRBY', parked_key, queue, -1) <= 0 then
        redis.call('HDEL', parked_key, queue)
    end
end

