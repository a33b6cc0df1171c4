#!/usr/bin/env bash
# Load test: direct-to-upstream vs through sluice (embedded and Redis store), in one run.
#   scripts/bench.sh [DURATION]    (default 10s; needs wrk: apt-get install -y wrk)
# sluice runs with ONE worker thread; wrk uses -t1 -c64 against a trivial upstream.
# Prints requests/s, p99 latency and the ratio to direct for every scenario (nginx and HAProxy
# references when installed), the 429 path per proxy CPU-second against both, then the TLS
# comparison against nginx (scripts/bench_tls.sh) when openssl is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}

. scripts/bench_lib.sh
bench_setup
GW=$(free_port); ADM=$(free_port)

# A one-worker gateway: /allow (a limit never reached), /deny (1 per week: nearly all 429),
# and / (no limit). $3 is the store section (empty: the embedded store).
gateway() { # gateway_port admin_port store_yaml name
  cat > "$tmp/$4.yaml" <<YAML
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
workers: 1
$3
upstreams:
  up: { targets: [http://127.0.0.1:$UP] }
routes:
  - name: allow
    match: { path_prefix: /allow }
    upstream: up
    limits:
      - { name: per-ip, by: ip, algorithm: token_bucket, rate: 10000000/1s }
  - name: deny
    match: { path_prefix: /deny }
    upstream: up
    limits:
      - { name: per-ip, by: ip, algorithm: fixed_window, rate: 1/7d }
  - name: plain
    match: { path_prefix: / }
    upstream: up
YAML
  RUST_LOG=${RUST_LOG:-info,sluice::access=off} "$rel/sluice" run -c "$tmp/$4.yaml" 2>/dev/null & pids+=($!)
}
gateway "$GW" "$ADM" "" bench
GWPID=${pids[-1]}   # its CPU is measured on the 429 path
sleep 1

curl -s -o /dev/null "http://127.0.0.1:$GW/deny"   # use up the single allowed request
printf '%-34s %12s %10s %8s\n' scenario req/s p99_ms ratio
read -r direct dp99 < <(run direct "http://127.0.0.1:$UP/")
printf '%-34s %12.0f %10.2f %8s\n' "direct to upstream" "$direct" "$dp99" "1.00"
row() { printf '%-34s %12.0f %10.2f %8.2f\n' "$1" "$2" "$3" "$(awk -v a="$2" -v b="$direct" 'BEGIN{print a/b}')"; }
for s in "plain:/plain" "limited, allow path:/allow"; do
  name=${s%%:*}; path=${s#*:}
  read -r rps p99 < <(run "$name" "http://127.0.0.1:$GW$path")
  row "sluice $name" "$rps" "$p99"
done
# The 429 paths (sluice's, nginx's, HAProxy's) are measured with their proxy's CPU, for the
# per-CPU-second comparison at the end: every request from one client (KEYS=0).
read -r s429 s429p99 s429cpu < <(KEYS=0 runk "http://127.0.0.1:$GW/deny" "$GWPID")
row "sluice limited, 429 path" "$s429" "$s429p99"

# Redis-backed routes (issue: Redis store), if redis-server is installed: a second sluice
# (one worker) whose store is a local redis-server; requests share FCALLs (batches).
if command -v redis-server >/dev/null; then
  RP=$(free_port); GW2=$(free_port); ADM2=$(free_port)
  redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" & pids+=($!)
  gateway "$GW2" "$ADM2" "store:
  kind: redis
  redis: { url: \"redis://127.0.0.1:$RP/0\", timeout: 200ms, pool_size: 4 }
  on_error: deny" bench-redis
  sleep 1
  curl -s -o /dev/null "http://127.0.0.1:$GW2/deny"
  redis-cli -p "$RP" CONFIG RESETSTAT >/dev/null
  t0=$(date +%s.%N)
  for s in "redis-limited, allow path:/allow" "redis-limited, 429 path:/deny"; do
    name=${s%%:*}; path=${s#*:}
    read -r rps p99 < <(run "$name" "http://127.0.0.1:$GW2$path")
    row "sluice $name" "$rps" "$p99"
  done
  t1=$(date +%s.%N)
  calls=$(redis-cli -p "$RP" INFO commandstats | awk -F'[=,:]' '/^cmdstat_(fcall|evalsha|eval):/ {n += $3} END {print n + 0}')
  awk -v c="$calls" -v a="$t0" -v b="$t1" 'BEGIN{printf "%-34s %12.0f script calls/s over both redis runs (%d calls)\n", "redis decisions", c/(b-a), c}'

  # Reference: nginx (one worker) + lua-nginx-module making the same decision, one FCALL of
  # the library sluice loaded per request over a keep-alive cosocket (Debian:
  # libnginx-mod-http-lua).
  LUAMOD=/usr/lib/nginx/modules/ngx_http_lua_module.so
  if command -v nginx >/dev/null && [ -f "$LUAMOD" ]; then
    lib=$(redis-cli -p "$RP" FUNCTION LIST LIBRARYNAME 'sluice_*' | awk 'p == "library_name" {print; exit} {p = $0}')
    if [[ $lib =~ ^sluice_[0-9a-f]{40}$ ]]; then
      NL=$(free_port)
      { printf 'load_module /usr/lib/nginx/modules/ndk_http_module.so;\nload_module %s;\n' "$LUAMOD"
        nginx_head 1 | sed "s|$tmp/nginx|$tmp/nginx-lua|g"
        cat <<NGINX
  server {
    listen 127.0.0.1:$NL;
    location / {
      access_by_lua_block {
        local args = { "FCALL", "$lib", "1", "nginx:allow:per-ip:{" .. ngx.var.remote_addr .. "}",
          "n" .. ngx.var.connection .. ":" .. ngx.var.connection_requests, "1", "token_bucket",
          "10000000", "1000000", "10000000", "1", "1", "1", "0", "0" }
        local req = { "*", #args, "\\r\\n" }
        for _, a in ipairs(args) do
          req[#req + 1] = "\$" .. #a .. "\\r\\n" .. a .. "\\r\\n"
        end
        local sock = ngx.socket.tcp()
        sock:settimeouts(200, 200, 200)
        assert(sock:connect("127.0.0.1", $RP))
        assert(sock:send(req))
        local head = assert(sock:receive("*l"))
        local code = assert(sock:receive("*l"))
        for _ = 2, 5 do assert(sock:receive("*l")) end
        sock:setkeepalive(10000, 64)
        if head ~= "*5" then return ngx.exit(503) end
        if code ~= ":0" then return ngx.exit(429) end
      }
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
    }
  }
}
NGINX
      } > "$tmp/nginx-lua.conf"
      nginx -c "$tmp/nginx-lua.conf" 2>/dev/null & pids+=($!)
      sleep 0.5
      if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$NL/")" = "200" ]; then
        read -r rps p99 < <(run nginx-lua "http://127.0.0.1:$NL/")
        row "nginx+lua redis, allow path" "$rps" "$p99"
      else
        echo "nginx+lua reference did not answer 200; see $tmp/nginx-lua-error.log" >&2
      fi
    else
      echo "nginx+lua reference skipped: no sluice library in FUNCTION LIST (got '$lib')" >&2
    fi
  fi
fi

# Reference on the same machine, if nginx is installed: one worker, keep-alive upstream with
# no request cap, limit_req for the 429 path, access log off (as sluice's: like with like, as
# the shared peer rig configures both).
if command -v nginx >/dev/null; then
  NG=$(free_port)
  { nginx_head 1
    cat <<NGINX
  limit_req_zone \$binary_remote_addr zone=one:1m rate=1r/m;
  # Refusals logged below the error log's level, as the rig does: no log line per 429.
  limit_req_log_level notice;
  server {
    listen 127.0.0.1:$NG;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    location /deny { limit_req zone=one nodelay; limit_req_status 429; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
  } > "$tmp/nginx.conf"
  nginx -c "$tmp/nginx.conf" & pids+=($!)
  sleep 0.5
  ngpids=("${pids[-1]}" $(pgrep -P "${pids[-1]}"))   # the master and its worker
  curl -s -o /dev/null "http://127.0.0.1:$NG/deny"
  read -r rps p99 < <(run nginx "http://127.0.0.1:$NG/plain")
  row "nginx (1 worker) proxy" "$rps" "$p99"
  read -r n429 n429p99 n429cpu < <(KEYS=0 runk "http://127.0.0.1:$NG/deny" "${ngpids[@]}")
  row "nginx limit_req 429 path" "$n429" "$n429p99"
fi

# Reference, if HAProxy is installed: the peer rig's stick table (one thread, a sliding
# http_req_rate(1s) per key, nothing logged).
if command -v haproxy >/dev/null; then
  HP=$(free_port)
  cat > "$tmp/haproxy.cfg" <<HAPROXY
global
    nbthread 1
    maxconn 8000
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 60s
    option http-keep-alive
    http-reuse always
backend st_deny
    stick-table type string len 64 size 1m expire 10s store http_req_rate(1s)
frontend fe
    bind 127.0.0.1:$HP
    http-request set-var(txn.rlkey) req.hdr(x-api-key)
    http-request set-var(txn.rlkey) src if !{ var(txn.rlkey) -m found }
    http-request track-sc0 var(txn.rlkey) table st_deny
    http-request deny deny_status 429 hdr Retry-After 1 if { sc_http_req_rate(0) gt 1 }
    default_backend origin
backend origin
    server up 127.0.0.1:$UP maxconn 4096
HAPROXY
  haproxy -db -f "$tmp/haproxy.cfg" 2>/dev/null & pids+=($!)
  sleep 0.5
  read -r h429 h429p99 h429cpu < <(KEYS=0 runk "http://127.0.0.1:$HP/deny" "${pids[-1]}")
  row "haproxy stick table 429 path" "$h429" "$h429p99"
fi

# The 429 path like with like: every request from one client, so every proxy refuses all of
# them after the first (HAProxy counts refused requests too; sluice and limit_req do not, which
# only matters when some get through). Requests per CPU-second of the proxy's own processes.
# The peer rig's 429 row uses 10 000 keys instead: there sluice and limit_req forward one
# request per key per second and HAProxy almost none; scripts/bench_refuse_all.sh is the rig
# target that refuses all of them too (docs/performance.md, "The 429 path like with like").
echo
printf '%-34s %12s %10s %14s %10s\n' "429 path, one client" req/s p99_ms req/cpu-s "sluice ×"
printf '%-34s %12.0f %10.2f %14.0f %10s\n' "sluice (embedded store)" "$s429" "$s429p99" "$s429cpu" "–"
ref429() { # name rps p99 cpu; sluice × : sluice's requests per CPU-second over this proxy's.
  printf '%-34s %12.0f %10.2f %14.0f %10.2f\n' "$1" "$2" "$3" "$4" \
    "$(awk -v a="$4" -v b="$s429cpu" 'BEGIN{print (a > 0 ? b/a : 0)}')"
}
if [ -n "${n429:-}" ]; then ref429 "nginx limit_req" "$n429" "$n429p99" "$n429cpu"; fi
if [ -n "${h429:-}" ]; then ref429 "haproxy stick table" "$h429" "$h429p99" "$h429cpu"; fi

# TLS: keep-alive requests and full handshakes, sluice against nginx on the same certificate.
if command -v openssl >/dev/null; then
  echo
  scripts/bench_tls.sh "$dur"
fi
