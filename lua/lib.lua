-- Shared helpers of the limiter scripts. Everything is an integer number of microseconds
-- held exactly in a double (< 2^53); nothing is stored or returned as a float.

local MAX_EXACT = 9007199254740992 -- 2^53

-- A string of decimal digits as a number, or nil when absent, negative, fractional, in
-- exponent form or >= 2^53: corrupt or foreign state then reads as a fresh key (never as more
-- than a full quota), and ARGV must be plain integers.
local function int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^%d+$') then
    return nil
  end
  local v = tonumber(s)
  if v >= MAX_EXACT then return nil end
  return v
end

-- Integers print in full (`tostring` would print 1.7953151949079e+15).
local function fmt(v)
  return string.format('%d', v)
end

-- floor(a / b) for integers 0 <= a < 2^53, b >= 1, exact: the double quotient can round
-- up to the next integer, so correct it with exact products.
local function idiv(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

-- A TTL in µs as whole ms, rounded up, never 0.
local function ttl_ms(ttl_us)
  local ms = idiv(ttl_us + 999, 1000)
  if ms < 1 then ms = 1 end
  return fmt(ms)
end

-- TTL in the same script as the write (the sorted-set algorithms).
local function expire_us(key, ttl_us)
  redis.call('PEXPIRE', key, ttl_ms(ttl_us))
end

-- String state. Every algorithm but sliding_log and concurrency keeps a key's state in one
-- string, its integer fields joined by ':' (FIELDS names them), written with one SET … PX.
-- STATE[key] is this call's copy: the value, false when there is none, or WRONG when the key
-- holds another type. `prefetch` fills it with one MGET for every key of the call, and `put`
-- keeps it current, so the commit pass and later requests of a batch read what earlier ones
-- wrote without asking Redis. Sluice 0.1 kept these fields in a hash under the same
-- names: such a key is read once as it was, and becomes a string on its next write.
local FIELDS = {
  fixed_window = {'w', 'n'}, fixed_month = {'w', 'n'}, sliding_window = {'w', 'c', 'p'},
  token_bucket = {'n', 't'}, leaky_bucket = {'l', 't'}, gcra = {'tat'},
}
local PATTERN = {'^(%d+)$', '^(%d+):(%d+)$', '^(%d+):(%d+):(%d+)$'}
local STATE, WRONG = {}, {}
local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'

-- A key MGET saw no string at: none, a hash of an older sluice (its fields as a string, or
-- false when any is not a plain integer), or WRONG.
local function legacy(key, fields)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return false end
  if kind ~= 'hash' or #fields < 2 then return WRONG end
  local s = redis.call('HMGET', key, unpack(fields))
  local v = {}
  for i = 1, #fields do
    local n = int(s[i])
    if n == nil then return false end
    v[i] = fmt(n)
  end
  return table.concat(v, ':')
end

-- Read the string state of keys[i] (of algorithms[i]) into STATE: one MGET, plus one EXISTS
-- when some have none (TYPE and HMGET per key only when an older sluice's hash is there).
local function prefetch(keys, algorithms)
  if #keys == 0 then return end
  local values = redis.call('MGET', unpack(keys))
  local missing, fields = {}, {}
  for i, key in ipairs(keys) do
    if STATE[key] == nil then
      STATE[key] = values[i]
      if not values[i] then
        missing[#missing + 1] = key
        fields[#fields + 1] = FIELDS[algorithms[i]]
      end
    end
  end
  if #missing > 0 and redis.call('EXISTS', unpack(missing)) > 0 then
    for i, key in ipairs(missing) do STATE[key] = legacy(key, fields[i]) end
  end
end

-- A plain decimal matched by PATTERN as a number, or nil past 2^53.
local function digits(s)
  if s == nil or #s > 16 then return nil end
  local v = tonumber(s)
  if v >= MAX_EXACT then return nil end
  return v
end

-- The fields of key's state (of `algorithm`), each nil when the state is absent or not as
-- written: corrupt or foreign state reads as fresh. Raises on a key of another type.
local function state(key, algorithm)
  local v = STATE[key]
  if v == nil then
    prefetch({key}, {algorithm})
    v = STATE[key]
  end
  if v == WRONG then error({err = WRONGTYPE}) end
  if not v then return nil end
  local a, b, c = string.match(v, PATTERN[#FIELDS[algorithm]])
  return digits(a), digits(b), digits(c)
end

-- Write key's state (fields formatted already) with its TTL, in one SET.
local function put(key, value, ttl_us)
  redis.call('SET', key, value, 'PX', ttl_ms(ttl_us))
  STATE[key] = value
end

-- ALGO[name](key, p, now, cost, commit, nonce, index) -> code, limit, remaining, retry_us,
-- reset_us. p = {limit = N, window = W, capacity = C, interval = I, unit = u}. With commit, an
-- admitted request writes its new state; a limited (1) or impossible (2) one never writes.
-- nonce (unique per call) and index (the limit's position) only name sliding_log members.
local ALGO = {}
-- CHARGE[name](key, p, now, cost) -> the same five values: the bucket algorithms' charge after
-- the answer, into debt (window algorithms charge what still fits, in decide.lua).
local CHARGE = {}
