#!/usr/bin/env bash
# What a limit charged by the answer and a concurrency limit cost, against the same token
# bucket charged before forwarding, in one run, on the embedded store and on Redis:
#   scripts/bench_answers.sh [DURATION] [ROUNDS]    (default 10s, 3 rounds; needs wrk, and
#                                                     redis-server for the Redis half)
# One sluice per store (one worker), wrk -t1 -c64 with a random key of 10 000 per request
# (scripts/wrk_keys.lua, as the peer rig), on
#   /request   token bucket by api_key, never reached (the peer rig's sluice target): 1 call
#   /answer    the same limit with count_when: 2xx: a probe, then a charge after the answer
#   /inflight  concurrency by api_key, max never reached: take a slot, release it
# rotating the order every round; prints each round, then the medians' ratios to /request in
# requests per second and per CPU-second of the gateway (+ redis-server on Redis).
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
rounds=${2:-3}
. scripts/bench_lib.sh
bench_setup

config() { # port admin store-yaml
  cat <<YAML
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
workers: 1
$3
identities:
  api_key: { header: X-API-Key }
upstreams:
  up: { targets: [http://127.0.0.1:$UP] }
routes:
  - name: request
    match: { path_prefix: /request }
    upstream: up
    limits:
      - { name: k, by: api_key, algorithm: token_bucket, rate: 10000000/1s, burst: 10000000 }
  - name: answer
    match: { path_prefix: /answer }
    upstream: up
    limits:
      - { name: k, by: api_key, algorithm: token_bucket, rate: 10000000/1s, burst: 10000000, count_when: { status: [2xx] } }
  - name: inflight
    match: { path_prefix: /inflight }
    upstream: up
    limits:
      - { name: k, by: api_key, algorithm: concurrency, max: 10000, lease: 30s }
YAML
}

stores=("memory|store: { kind: memory }")
if command -v redis-server >/dev/null; then
  RP=$(free_port)
  redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" & redis_pid=$!; pids+=($redis_pid)
  stores+=("redis|store: { kind: redis, redis: { url: \"redis://127.0.0.1:$RP/0\", timeout: 200ms }, on_error: deny }")
else
  echo "redis-server not found (apt-get install -y redis-server): embedded store only" >&2
fi

printf '%-7s %-6s %-10s %10s %8s %14s\n' store round path req/s p99_ms req/cpu-s
summary=()
for s in "${stores[@]}"; do
  kind=${s%%|*}
  GW=$(free_port); ADM=$(free_port)
  config "$GW" "$ADM" "${s#*|}" > "$tmp/$kind.yaml"
  RUST_LOG=${RUST_LOG:-info,sluice::access=off} "$rel/sluice" run -c "$tmp/$kind.yaml" 2>/dev/null &
  gw_pid=$!; pids+=($gw_pid)
  watch=("$gw_pid"); [ "$kind" = redis ] && watch+=("$redis_pid")
  sleep 2
  for p in request answer inflight; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-API-Key: key-42' "http://127.0.0.1:$GW/$p")
    [ "$code" = 200 ] || { echo "$kind /$p answered $code" >&2; exit 1; }
  done
  declare -A rps=() cpu=()
  paths=(request answer inflight)
  for r in $(seq 1 "$rounds"); do
    for k in 0 1 2; do
      p=${paths[$(((r + k) % 3))]}
      read -r a ap ac < <(runk "http://127.0.0.1:$GW/$p" "${watch[@]}")
      printf '%-7s %-6s %-10s %10.0f %8.2f %14.0f\n' "$kind" "$r" "/$p" "$a" "$ap" "$ac"
      rps[$p]+="$a "; cpu[$p]+="$ac "
    done
  done
  kill "$gw_pid"
  # shellcheck disable=SC2086
  for p in answer inflight; do
    summary+=("$(printf '%-7s /%-9s %.3f in requests per second, %.3f per CPU-second (%s)' "$kind" "$p" \
      "$(awk -v a="$(median ${rps[$p]})" -v b="$(median ${rps[request]})" 'BEGIN{print a/b}')" \
      "$(awk -v a="$(median ${cpu[$p]})" -v b="$(median ${cpu[request]})" 'BEGIN{print a/b}')" \
      "$([ "$kind" = redis ] && echo 'gateway + redis-server' || echo gateway)")")
  done
  printf '%-7s medians: /request %.0f req/s, %.0f req/cpu-s\n' "$kind" "$(median ${rps[request]})" "$(median ${cpu[request]})"
done
echo "ratios to /request (medians of $rounds):"
printf '%s\n' "${summary[@]}"
