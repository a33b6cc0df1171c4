#!/usr/bin/env bash
# The plan path against the same limit without consumers, in one process, in one run:
#   scripts/bench_plans.sh [DURATION] [ROUNDS]    (default 10s, 3 rounds; needs wrk)
# One sluice (one worker), 10 000 consumers on one plan (a token bucket never reached),
# wrk -t1 -c64 with a random key of the 10 000 per request (scripts/wrk_keys.lua) on
#   /plans  consumers: required, the plan's limit (key -> consumer lookup, keyed by consumer)
#   /keyed  the same limit keyed by api_key, no consumers
# in ABBA order (plans first in odd rounds, keyed first in even ones), ROUNDS times each;
# prints each round's requests/s and requests per gateway CPU-second, and the ratios of the
# medians.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
rounds=${2:-3}
. scripts/bench_lib.sh
bench_setup
GW=$(free_port); ADM=$(free_port)

{
  cat <<YAML
listen: 127.0.0.1:$GW
admin_listen: 127.0.0.1:$ADM
workers: 1
identities:
  api_key: { header: X-API-Key }
plans:
  bench:
    limits:
      - { name: k, algorithm: token_bucket, rate: 10000000/1s, burst: 10000000 }
upstreams:
  up: { targets: [http://127.0.0.1:$UP] }
routes:
  - name: plans
    match: { path_prefix: /plans }
    upstream: up
    consumers: required
  - name: keyed
    match: { path_prefix: /keyed }
    upstream: up
    limits:
      - { name: k, by: api_key, algorithm: token_bucket, rate: 10000000/1s, burst: 10000000 }
consumers:
YAML
  for i in $(seq 0 9999); do
    echo "  - { name: c$i, plan: bench, keys: [key-$i] }"
  done
} > "$tmp/plans.yaml"
RUST_LOG=${RUST_LOG:-info,sluice::access=off} "$rel/sluice" run -c "$tmp/plans.yaml" 2>/dev/null &
gw_pid=$!; pids+=($gw_pid)
sleep 2
for p in plans keyed; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-API-Key: key-42' "http://127.0.0.1:$GW/$p")
  [ "$code" = 200 ] || { echo "/$p answered $code" >&2; exit 1; }
done

declare -A rps cpu
printf '%-6s %-40s %10s %8s %14s\n' round path req/s p99_ms req/cpu-s
for r in $(seq 1 "$rounds"); do
  order="plans keyed"; [ $((r % 2)) -eq 0 ] && order="keyed plans"
  for p in $order; do
    read -r a ap ac < <(runk "http://127.0.0.1:$GW/$p" "$gw_pid")
    printf '%-6s %-40s %10.0f %8.2f %14.0f\n' "$r" "/$p" "$a" "$ap" "$ac"
    rps[$p]+="$a "; cpu[$p]+="$ac "
  done
done
# shellcheck disable=SC2086
{
  pr=$(median ${rps[plans]}); kr=$(median ${rps[keyed]})
  pc=$(median ${cpu[plans]}); kc=$(median ${cpu[keyed]})
}
printf 'medians: /plans %.0f req/s, %.0f req/cpu-s; /keyed %.0f req/s, %.0f req/cpu-s\n' "$pr" "$pc" "$kr" "$kc"
printf 'plans / keyed: %.3f in requests per second, %.3f per gateway CPU-second\n' \
  "$(awk -v a="$pr" -v b="$kr" 'BEGIN{print a/b}')" "$(awk -v a="$pc" -v b="$kc" 'BEGIN{print a/b}')"
