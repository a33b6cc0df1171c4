-- The library's entry (Redis Functions, FCALL): Redis loads the library once and keeps it.
-- The body is built at the first call, because loading may not read Lua's globals, and kept:
-- a call then only decides, without defining the body's functions again.
local decide_now
redis.register_function{
  function_name = FUNCTION_NAME,
  flags = {'allow-cross-slot-keys'},
  callback = function(keys, argv)
    if decide_now == nil then decide_now = sluice() end
    return decide_now(keys, argv)
  end,
}
