-- wrk script: each request carries X-API-Key: key-N, N uniformly random below KEYS (10 000).
local keys = tonumber(os.getenv("KEYS") or "10000")
math.randomseed(os.time())
request = function()
  return wrk.format("GET", nil, { ["X-API-Key"] = "key-" .. math.random(0, keys - 1) })
end
