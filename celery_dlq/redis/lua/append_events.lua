-- append_events.lua: append a batch of events to the archive stream in one command (archive.py, EventLog).
--
-- KEYS[1] = events  (STREAM) the archive, Keys.events
--
-- ARGV[1] = the stream's cap (XADD MAXLEN ~)
-- ARGV[2] = the events, JSON: a list of events, each a flat list of stream fields and values
--           ["v", "1", "type", "replayed", ...], names and text exactly as archive.py made them
--           (archive.SCHEMA is the only place that names them)
--
-- Returns how many events were appended. One JSON argument rather than one per field: the client's
-- cost of a command grows with its number of arguments, and a replay writes one event per letter.

local events = cjson.decode(ARGV[2])
for _, event in ipairs(events) do
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(event))
end
return #events
