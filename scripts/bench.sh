#!/usr/bin/env bash
# Load test: direct-to-upstream vs through sluice (embedded and Redis store), in one run.
#   scripts/bench.sh [DURATION]    (default 10s; needs wrk: apt-get install -y wrk)
# sluice runs with ONE worker thread; wrk uses -t1 -c64 against a trivial upstream.
# Prints requests/s, p99 latency and the ratio to direct for every scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
command -v wrk >/dev/null || { echo "wrk not found: apt-get install -y wrk" >&2; exit 1; }
cargo build --release --bin sluice --example demo_upstream >/dev/null 2>&1

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port); GW=$(free_port); ADM=$(free_port)
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

target/release/examples/demo_upstream "127.0.0.1:$UP" 2>/dev/null & pids+=($!)

cat > "$tmp/bench.yaml" <<YAML
listen: 127.0.0.1:$GW
admin_listen: 127.0.0.1:$ADM
workers: 1
upstreams:
  up: { targets: [http://127.0.0.1:$UP] }
routes:
  - name: allow
    match: { path_prefix: /allow }
    upstream: up
    limits:
      - { name: per-ip, by: ip, algorithm: gcra, rate: 10000000/1s }
  - name: deny
    match: { path_prefix: /deny }
    upstream: up
    limits:
      - { name: per-ip, by: ip, algorithm: fixed_window, rate: 1/7d }
  - name: plain
    match: { path_prefix: / }
    upstream: up
YAML
RUST_LOG=${RUST_LOG:-info} target/release/sluice run -c "$tmp/bench.yaml" 2>/dev/null & pids+=($!)
sleep 1

run() { # name url -> "rps p99_ms"
  local out rps p99
  out=$(wrk -t1 -c64 -d"$dur" --latency "$2")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub("us","",v); v=v/1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v=v*1000}; print v}' <<<"$out")
  echo "$rps $p99"
}

curl -s -o /dev/null "http://127.0.0.1:$GW/deny"   # use up the single allowed request
printf '%-28s %12s %10s %8s\n' scenario req/s p99_ms ratio
read -r direct dp99 < <(run direct "http://127.0.0.1:$UP/")
printf '%-28s %12.0f %10.2f %8s\n' "direct to upstream" "$direct" "$dp99" "1.00"
row() { printf '%-28s %12.0f %10.2f %8.2f\n' "$1" "$2" "$3" "$(awk -v a="$2" -v b="$direct" 'BEGIN{print a/b}')"; }
for s in "plain:/plain" "limited, allow path:/allow" "limited, 429 path:/deny"; do
  name=${s%%:*}; path=${s#*:}
  read -r rps p99 < <(run "$name" "http://127.0.0.1:$GW$path")
  row "sluice $name" "$rps" "$p99"
done

# Redis-backed routes (issue: Redis store), if redis-server is installed: a second sluice
# (one worker) whose store is a local redis-server; every request is one EVALSHA.
if command -v redis-server >/dev/null; then
  RP=$(free_port); GW2=$(free_port); ADM2=$(free_port)
  redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" & pids+=($!)
  cat > "$tmp/bench-redis.yaml" <<YAML
listen: 127.0.0.1:$GW2
admin_listen: 127.0.0.1:$ADM2
workers: 1
store:
  kind: redis
  redis: { url: "redis://127.0.0.1:$RP/0", timeout: 200ms, pool_size: 4 }
  on_error: deny
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
YAML
  RUST_LOG=${RUST_LOG:-info} target/release/sluice run -c "$tmp/bench-redis.yaml" 2>/dev/null & pids+=($!)
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
  calls=$(redis-cli -p "$RP" INFO commandstats | awk -F'[=,:]' '/^cmdstat_evalsha/ {print $3}')
  awk -v c="$calls" -v a="$t0" -v b="$t1" 'BEGIN{printf "%-28s %12.0f evalsha/s over both redis runs (%d calls)\n", "redis decisions", c/(b-a), c}'
fi

# Reference on the same machine, if nginx is installed: one worker, keep-alive upstream,
# limit_req for the 429 path, access log on (as sluice's).
if command -v nginx >/dev/null; then
  NG=$(free_port)
  cat > "$tmp/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log $tmp/nginx-access.log;
  client_body_temp_path $tmp; proxy_temp_path $tmp; fastcgi_temp_path $tmp; uwsgi_temp_path $tmp; scgi_temp_path $tmp;
  limit_req_zone \$binary_remote_addr zone=one:1m rate=1r/m;
  upstream up { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$NG;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    location /deny { limit_req zone=one nodelay; limit_req_status 429; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
  nginx -c "$tmp/nginx.conf" & pids+=($!)
  sleep 0.5
  curl -s -o /dev/null "http://127.0.0.1:$NG/deny"
  read -r rps p99 < <(run nginx "http://127.0.0.1:$NG/plain")
  row "nginx (1 worker) proxy" "$rps" "$p99"
  read -r rps p99 < <(run nginx "http://127.0.0.1:$NG/deny")
  row "nginx limit_req 429 path" "$rps" "$p99"
fi
