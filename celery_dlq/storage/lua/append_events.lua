-- append_events.lua: append a batch of events to the archive stream in one command (archive.py, EventLog).
--
-- KEYS[1] = events  (STREAM) the archive, Keys.events
--
-- ARGV[1] = the stream's cap (XADD MAXLEN ~)
-- ARGV[2] = the entries' field names, JSON: events.ENTRY_NAMES (the schema is named there only)
-- ARGV[3] = the entries, JSON: a list of lists of texts, one per name ("" where the event has none),
--           exactly as events.py made them
--
-- Each entry becomes one XADD of its non-empty fields, in order: what EventLog writes for one event.
-- Returns how many were appended. JSON, not one argument per field: the client's cost of a command
-- grows with its number of arguments, and a replay writes one event per letter.

local names = cjson.decode(ARGV[2])
local entries = cjson.decode(ARGV[3])
for _, texts in ipairs(entries) do
    local fields = {}
    for i, name in ipairs(names) do
        local text = texts[i]
        if type(text) == 'string' and text ~= '' then
            fields[#fields + 1] = name
            fields[#fields + 1] = text
        end
    end
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
end
return #entries
