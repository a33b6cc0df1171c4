-- Entry point: decide at the store's own clock, so gateways with skewed clocks agree.
local t = redis.call('TIME')
return decide(tonumber(t[1]) * 1000000 + tonumber(t[2]), 0)
