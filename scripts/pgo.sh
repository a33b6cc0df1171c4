#!/usr/bin/env bash
# Remake pgo/sluice.profdata, the profile that release builds are optimized with
# (scripts/rustc-pgo, set as cargo's rustc wrapper in .cargo/config.toml):
#   scripts/pgo.sh [SECONDS]        (default 3 s per workload; about 2 min after the build)
# 1. builds sluice instrumented (`-Cprofile-generate`, into target/pgo-train);
# 2. runs it as an operator would, on the embedded store and then on Redis: plain proxying,
#    every algorithm allowing and refusing with 10 000 keys, answer-charged and concurrency
#    limits, request bodies, TLS (kept-alive and fresh handshakes), admin scrapes and a reload;
# 3. merges what it counted into pgo/sluice.profdata, records the LLVM that wrote it
#    (pgo/sluice.meta) and the sluice functions it has counts for (pgo/sluice.functions, what
#    scripts/pgo_check.sh compares a binary with, so that the check needs no llvm-tools).
# 4. rebuilds the release binaries with it (scripts/build_release.sh --strict, which starts
#    the release directory over for a new profile and checks that the profile names the
#    binary's functions).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
for tool in wrk redis-server openssl curl; do
  command -v "$tool" >/dev/null || {
    echo "$tool not found: apt-get install -y wrk redis-server openssl curl" >&2
    exit 1
  }
done
. scripts/bench_lib.sh
profdata=$(llvm_profdata)
llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
commit=$(git describe --always --dirty) # of the code trained, before the profile is rewritten

tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"' EXIT

echo "building the instrumented binary (target/pgo-train)"
# The binary, then the upstream, each in a cargo run of its own as scripts/build_release.sh
# builds them (why there: one run renames every symbol, and the profile would match none; the
# profiles committed from f110b08 to 98a2ce3 were made so). Not with that script itself: its
# profile check is of release builds, not of this instrumented one.
# Build scripts and proc macros are instrumented too (RUSTFLAGS reach them); their counts,
# written as they run during the build, go to $tmp and are not used. (Building with --target
# would spare them, but it changes every symbol's name as well.)
for what in "--bin sluice" "--example demo_upstream"; do
  # shellcheck disable=SC2086 # two words each
  SLUICE_PGO=off RUSTFLAGS="-Cprofile-generate" LLVM_PROFILE_FILE="$tmp/build-%p.profraw" \
    cargo build --release --quiet --target-dir target/pgo-train $what
done
built=target/pgo-train/release
bin=$built/sluice

UP=$(free_port); REDIS=$(free_port)
# The upstream is instrumented too; its counts are thrown away.
LLVM_PROFILE_FILE="$tmp/upstream-%p.profraw" "$built/examples/demo_upstream" \
  "127.0.0.1:$UP" 2>/dev/null & pids+=($!)
redis-server --port "$REDIS" --bind 127.0.0.1 --save '' --appendonly no >/dev/null & pids+=($!)
self_signed_cert
printf 'wrk.method = "POST"\nwrk.body = string.rep("x", 2048)\nwrk.headers["Content-Type"] = "text/plain"\n' \
  > "$tmp/post.lua"

config() { # store-yaml
  local limit="by: api_key, on_missing: ip"
  cat <<YAML
listen:
  - address: 127.0.0.1:$P
  - address: 127.0.0.1:$PT
    tls: { certificates: [ { cert: $tmp/tls.crt, key: $tmp/tls.key } ] }
admin_listen: 127.0.0.1:$ADM
workers: 1
store: $1
upstreams: { up: { targets: ["http://127.0.0.1:$UP"] } }
routes:
  - { name: plain, match: { path_prefix: /plain }, upstream: up }
  - name: deny
    match: { path: /deny }
    upstream: up
    limits: [ { name: k, $limit, algorithm: token_bucket, rate: 1/1s, burst: 1 } ]
  - name: algorithms
    match: { path_prefix: /algo }
    upstream: up
    limits:
      - { name: gcra, $limit, algorithm: gcra, rate: 50/1s, burst: 5 }
      - { name: leaky, $limit, algorithm: leaky_bucket, rate: 50/1s, burst: 5 }
      - { name: fixed, $limit, algorithm: fixed_window, rate: 40/1s }
      - { name: sliding, $limit, algorithm: sliding_window, rate: 40/1s }
      - { name: log, $limit, algorithm: sliding_log, rate: 30/1s }
  - name: answers
    match: { path_prefix: /answers }
    upstream: up
    limits:
      - { name: errors, $limit, algorithm: sliding_window, rate: 5/1s, count_when: { status: [401, 403] } }
      - { name: tokens, $limit, algorithm: token_bucket, rate: 100/1s, cost: { response_header: X-Tokens-Used, default: 0, max: 100 } }
      - { name: in-flight, $limit, algorithm: concurrency, max: 2, lease: 30s }
  - name: pass
    match: { path_prefix: / }
    upstream: up
    limits: [ { name: k, $limit, algorithm: token_bucket, rate: 10000000/1s, burst: 10000000 } ]
YAML
}

train() { # name store-yaml
  P=$(free_port); PT=$(free_port); ADM=$(free_port)
  config "$2" > "$tmp/$1.yaml"
  LLVM_PROFILE_FILE="$tmp/raw/sluice-%p.profraw" RUST_LOG=off "$bin" run -c "$tmp/$1.yaml" &
  local pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "127.0.0.1:$P/" && break; sleep 0.1; done
  # A gateway that never came up would leave a profile of nothing: stop instead.
  curl -sf -o /dev/null "127.0.0.1:$P/plain" || { echo "sluice did not start on $tmp/$1.yaml" >&2; exit 1; }
  echo "training on the $1 store (${secs}s per workload)"
  local url="http://127.0.0.1:$P" d="${secs}s" w=(wrk -t1 -c64 -s scripts/wrk_keys.lua)
  for path in /plain / /deny /algo/x "/answers/x?status=403" "/answers/x?tokens=3"; do
    KEYS=10000 "${w[@]}" -d"$d" "$url$path" >/dev/null
  done
  KEYS=0 wrk -t1 -c64 -d"$d" "$url/deny" >/dev/null
  wrk -t1 -c64 -d"$d" -s "$tmp/post.lua" "$url/" >/dev/null
  KEYS=10000 "${w[@]}" -d"$d" "https://localhost:$PT/" >/dev/null
  for _ in $(seq 200); do
    curl -s -o /dev/null --cacert "$tmp/tls.crt" --resolve "localhost:$PT:127.0.0.1" "https://localhost:$PT/"
  done
  for _ in $(seq 20); do curl -s -o /dev/null "127.0.0.1:$ADM/metrics"; done
  kill -HUP "$pid"; sleep 0.5
  kill -TERM "$pid"; wait "$pid"
}

mkdir -p "$tmp/raw"
train embedded "{ kind: memory }"
train redis "{ kind: redis, redis: { url: \"redis://127.0.0.1:$REDIS\", timeout: 200ms }, on_error: deny }"

"$profdata" merge -o pgo/sluice.profdata "$tmp"/raw/*.profraw
printf 'llvm_major=%s\nrustc=%s\ncommit=%s\n' "$llvm_major" "$(rustc -V)" "$commit" \
  > pgo/sluice.meta
"$profdata" show --all-functions pgo/sluice.profdata | sluice_functions > pgo/sluice.functions
echo "wrote pgo/sluice.profdata ($(wc -c < pgo/sluice.profdata) bytes), pgo/sluice.meta and" \
  "pgo/sluice.functions ($(wc -l < pgo/sluice.functions) functions)"
echo "rebuilding the release binaries with it (scripts/build_release.sh)"
scripts/build_release.sh --strict --quiet
