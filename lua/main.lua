-- EVAL's entry: Redis runs the whole script at every call, so the body is built per call.
return (sluice())(KEYS, ARGV)
