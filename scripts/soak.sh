#!/usr/bin/env bash
# Fault soak (on demand, not in CI): two sluice gateways sharing one Redis, under wrk load,
# while Redis is killed and restarted, paused, put to sleep and flushed, and both gateways
# reload their config 30 times. Checks that no answer waits past store timeout + 50 ms, that
# limiting resumes soon after Redis returns, and that exact limits never over-admit.
#
#   scripts/soak.sh [DURATION_SECONDS]     (default 75, at least 60)
#   env: SOAK_DIR (run directory), WRK_CONN (16), EXACT_SEND (100), SOAK_LOAD_NICE (10),
#        RUST_LOG (info), CARGO_TARGET_DIR
#
# Installs redis-server, redis-tools and wrk with apt if missing, builds the release binaries
# (honours CARGO_TARGET_DIR), and keeps every log and metrics snapshot in a run directory
# ($SOAK_DIR, default a fresh /tmp/sluice-soak.XXXXXX) printed at the end. Everything
# listens on 127.0.0.1 only; every process started here is stopped on exit.
#
# Exit status: 0 when every check passes; 1 when an exact-limit route admitted more than its N
# (or, in a check where Redis stayed healthy, other than exactly N) or the probe saw an answer
# slower than store timeout + 50 ms; 2 on a setup failure.
#
# Faults (seconds after the load starts):
#   6 SIGKILL Redis, restart it 4 s later      20 CLIENT PAUSE 2000     28 DEBUG SLEEP 1
#  34 FLUSHALL                41 FUNCTION FLUSH + SCRIPT FLUSH          45 SIGKILL Redis, 2 s down
# Exact-limit checks (fresh key each, N = 50 per hour, EXACT_SEND requests per gateway and route):
#   before the load, at 2, 16 (after the restart), 21.3 to ~23 (60/s per stream, across the end
#   of the pause and the breaker closing: only <= N is required), 37 (after FLUSHALL), 53, and
#   once more after the load, after a final FLUSHALL.
# Longest answer: a curl probe per gateway (/allow and /deny, 10 per second each, own
# connection) decides the exit status; wrk's max latency and the gateway's own histogram are
# reported beside it. Load starts only once both gateways' /readyz answer 200.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh # free_port

D=${1:-75}
[[ $D =~ ^[0-9]+$ ]] && ((D >= 60)) || { echo "usage: $0 [DURATION_SECONDS >= 60]" >&2; exit 2; }
TIMEOUT_MS=50                 # store.redis.timeout
LIMIT_MS=$((TIMEOUT_MS + 50)) # the longest answer allowed
N=50                          # exact-limit routes: N per hour
EXACT_SEND=${EXACT_SEND:-100} # per gateway and route in each exact check (2 gateways: 4 x N)
RELOADS=30                    # per gateway
WRK_CONN=${WRK_CONN:-16}
# The load generators (wrk, the exact-check curls) run at this niceness so that, on a small
# machine, they do not take the CPU from the gateways, Redis and the upstream they measure.
LOAD_NICE=${SOAK_LOAD_NICE:-10}

# --- tools -------------------------------------------------------------------------------
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v wrk >/dev/null || need+=(wrk)
command -v curl >/dev/null || need+=(curl)
command -v python3 >/dev/null || need+=(python3)
if ((${#need[@]})); then
  SUDO=; (($(id -u) == 0)) || SUDO=sudo
  echo "installing ${need[*]}" >&2
  $SUDO apt-get install -y "${need[@]}" >/dev/null ||
    { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y "${need[@]}" >/dev/null; }
fi
rv=$(redis-server --version | sed -n 's/.* v=\([0-9]*\)\..*/\1/p')
((rv >= 7)) || { echo "redis-server 7 or newer needed (found $(redis-server --version))" >&2; exit 2; }

echo "building (scripts/build_release.sh)..." >&2
built=$(scripts/build_release.sh)

run=${SOAK_DIR:-$(mktemp -d /tmp/sluice-soak.XXXXXX)}
if [[ -n ${SOAK_DIR:-} && -d $run && -n $(ls -A "$run") ]]; then
  echo "SOAK_DIR $run is not empty" >&2; exit 2
fi
mkdir -p "$run"/{bin,metrics,exact,faults}
# Copies: a shared target directory may be rebuilt from another tree while the soak runs.
cp "$built/sluice" "$built/examples/demo_upstream" "$run/bin/"
BIN=$run/bin

RP=$(free_port); UP=$(free_port)
declare -A GWP ADM
for g in 1 2; do GWP[$g]=$(free_port); ADM[$g]=$(free_port); done

pids=()
REDIS_PID=
cleanup() {
  touch "$run/stop"
  local p
  for p in "${pids[@]}" $REDIS_PID; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { echo "$EPOCHREALTIME"; }
T0=$(now)
# Sleep until T seconds after T0.
at() { sleep "$(awk -v z="$T0" -v t="$1" -v n="$EPOCHREALTIME" 'BEGIN { d = z + t - n; printf "%.3f", d < 0 ? 0 : d }')"; }
rel() { awk -v z="$T0" -v t="$1" 'BEGIN { if (t == "none") print "none"; else printf "%.2f", t - z }'; }
log() { echo "[$(rel "$(now)")s] $*" >&2; }
rcli() { redis-cli -p "$RP" "$@"; }

# --- Redis, upstream, two gateways ---------------------------------------------------------
start_redis() {
  redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$run" \
    --logfile "$run/redis.log" --enable-debug-command local --maxmemory-policy noeviction &
  REDIS_PID=$!
}
wait_pong() { # -> epoch time of the first PONG (or "none" after 10 s)
  local end=$((SECONDS + 10))
  while ((SECONDS < end)); do
    [[ $(rcli PING 2>/dev/null) == PONG ]] && { now; return; }
    sleep 0.005
  done
  echo none
}

# $2: the per-ip rate of the `knob` route, the only thing a reload changes.
write_config() { # gateway knob
  cat >"$run/gw$1.yaml.tmp" <<YAML
listen: 127.0.0.1:${GWP[$1]}
admin_listen: 127.0.0.1:${ADM[$1]}
workers: 1
store:
  kind: redis
  redis: { url: "redis://127.0.0.1:$RP/0", timeout: ${TIMEOUT_MS}ms }
  on_error: allow
upstreams:
  up: { targets: [http://127.0.0.1:$UP] }
routes:
  - name: allow          # limit never reached; fails open
    match: { path_prefix: /allow }
    upstream: up
    on_store_error: allow
    limits:
      - { name: per-key, by: api_key, algorithm: token_bucket, rate: 1000000/1s }
  - name: deny           # limit never reached; fails closed (503)
    match: { path_prefix: /deny }
    upstream: up
    on_store_error: deny
    limits:
      - { name: per-key, by: api_key, algorithm: token_bucket, rate: 1000000/1s }
  - name: exact-fw       # exact: at most N per key per hour, fails closed
    match: { path_prefix: /exact-fw }
    upstream: up
    on_store_error: deny
    limits:
      - { name: per-key, by: "header:X-Soak-Key", algorithm: fixed_window, rate: $N/1h, on_missing: reject }
  - name: exact-sl
    match: { path_prefix: /exact-sl }
    upstream: up
    on_store_error: deny
    limits:
      - { name: per-key, by: "header:X-Soak-Key", algorithm: sliding_log, rate: $N/1h, on_missing: reject }
  - name: knob           # never requested; reloads edit its rate
    match: { path_prefix: /knob }
    upstream: up
    limits:
      - { name: per-ip, by: ip, algorithm: gcra, rate: $2/1m }
YAML
  mv "$run/gw$1.yaml.tmp" "$run/gw$1.yaml"
}

start_redis
"$BIN/demo_upstream" "127.0.0.1:$UP" 2>"$run/upstream.log" & pids+=($!)
[[ $(wait_pong) != none ]] || { echo "redis did not start; see $run/redis.log" >&2; exit 2; }
for g in 1 2; do
  write_config "$g" 1000
  RUST_LOG=${RUST_LOG:-info} "$BIN/sluice" run -c "$run/gw$g.yaml" 2>"$run/gw$g.log" & pids+=($!)
done

# Known start-up issue: the first moments after start are not decided by Redis. Start only
# once /readyz is 200 and /deny has been decided by the store (200) on both gateways.
for g in 1 2; do
  ok=
  for _ in $(seq 300); do
    if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${ADM[$g]}/readyz") == 200 &&
      $(curl -s -o /dev/null -w '%{http_code}' -H 'X-Api-Key: soak-ready' "http://127.0.0.1:${GWP[$g]}/deny") == 200 ]]; then
      ok=1; break
    fi
    sleep 0.1
  done
  [[ $ok ]] || { echo "gateway $g not ready within 30 s; see $run/gw$g.log" >&2; exit 2; }
done
log "redis :$RP, upstream :$UP, gateways :${GWP[1]} (admin :${ADM[1]}) and :${GWP[2]} (admin :${ADM[2]}) ready"

snap() { local g; for g in 1 2; do curl -s "http://127.0.0.1:${ADM[$g]}/metrics" >"$run/metrics/$1.g$g.prom"; done; }

# --- exact-limit check ---------------------------------------------------------------------
# EXACT_SEND requests per gateway and route, all four streams at once (4 in flight each, or
# one at a time at RATE, e.g. 60/s, to spread a check over a fault's end), with one fresh key.
# Writes exact/LABEL.ROUTE.gG (one status code per line) and exact/LABEL.meta.
exact_check() { # label key [rate]
  local label=$1 key=$2 r g t0 t1 cp=() pace=(--parallel --parallel-max 4)
  [[ -z ${3:-} ]] || pace=(--rate "$3")
  t0=$(now)
  for r in exact-fw exact-sl; do
    for g in 1 2; do
      nice -n "$LOAD_NICE" curl -s "${pace[@]}" --max-time 5 -H "X-Soak-Key: $key" -o /dev/null \
        -w '%{http_code}\n' "http://127.0.0.1:${GWP[$g]}/$r?i=[1-$EXACT_SEND]" \
        >"$run/exact/$label.$r.g$g" 2>/dev/null &
      cp+=($!)
    done
  done
  wait "${cp[@]}" || true
  t1=$(now)
  # A fixed window is epoch-aligned: a check straddling an hour boundary may admit 2N.
  echo "$t0 $t1 $(awk -v a="$t0" -v b="$t1" 'BEGIN { print (int(a / 3600) != int(b / 3600)) }')" >"$run/exact/$label.meta"
  echo "$label" >>"$run/exact/order"
}

# --- probes ----------------------------------------------------------------------------------
# Low rate, each its own connection. One line per answer: "start end route code seconds id";
# the id (X-Request-Id) finds the request in the gateway's access log.
probe_loop() { # gateway
  local r out t n=0 id
  while [[ ! -e $run/stop ]]; do
    for r in allow deny; do
      n=$((n + 1)); id=soak-p$1-$n; t=$(now)
      out=$(curl -s -o /dev/null --max-time 5 -H 'X-Api-Key: soak-probe' -H "X-Request-Id: $id" \
        -w '%{http_code} %{time_total}' "http://127.0.0.1:${GWP[$1]}/$r") || true
      echo "$t $(now) $r ${out:-000 5} $id" >>"$run/probe.g$1.log"
    done
    sleep 0.1
  done
}

# Host scheduling stalls: a 20 ms wait (bash builtin, no process spawned) that overshoots by
# more than 20 ms means this machine left a runnable process waiting for a CPU that long; any
# answer measured across such a stall is slowed by it, whatever the gateway does.
# One line per stall: "end_epoch_us overshoot_us".
stall_loop() {
  local fd prev t gap
  mkfifo "$run/never"; exec {fd}<>"$run/never"
  prev=${EPOCHREALTIME/./}
  while [[ ! -e $run/stop ]]; do
    read -r -t 0.02 -u "$fd" _ || true
    t=${EPOCHREALTIME/./}; gap=$((t - prev - 20000)); prev=$t
    ((gap <= 20000)) || echo "$t $gap" >>"$run/stalls.log"
  done
}
# "busy_ticks soak_ticks": CPU used by the whole machine (/proc/stat) and by this script's
# process group (its live processes plus the children they reaped), in clock ticks.
PGRP=$(awk '{ sub(/.*\) /, ""); print $3 }' /proc/$$/stat)
cpu_ticks() {
  echo "$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat)" \
    "$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v pg="$PGRP" '{ sub(/.*\) /, ""); if ($3 == pg) s += $12 + $13 + $14 + $15 } END { print s + 0 }')"
}
# PSI totals (µs): CPU "some" (a runnable task waited) and I/O "full" (every task waited on I/O;
# a gateway logging to a file on a stalled disk stops answering while its log write blocks).
psi_cpu() { awk '/^some/ { sub("total=", "", $5); print $5 }' /proc/pressure/cpu 2>/dev/null || true; }
psi_io() { awk '/^full/ { sub("total=", "", $5); print $5 }' /proc/pressure/io 2>/dev/null || true; }

# First answer on /deny decided by the store (200 or 429; a store failure there is a 503).
# Writes "end_epoch,seconds_the_request_took" (or "none").
first_decided() { # gateway outfile
  local end=$((SECONDS + 20)) out
  while ((SECONDS < end)); do
    out=$(curl -s -o /dev/null --max-time 2 -H 'X-Api-Key: soak-recovery' -w '%{http_code} %{time_total}' \
      "http://127.0.0.1:${GWP[$1]}/deny") || true
    if [[ $out == 200\ * || $out == 429\ * ]]; then echo "$(now),${out#* }" >"$2"; return; fi
    sleep 0.01
  done
  echo none >"$2"
}

# --- config reloads ------------------------------------------------------------------------
reloader() {
  local i g code ver step
  step=$(awk -v d="$D" -v n="$RELOADS" 'BEGIN { printf "%.3f", (d - 5) / n }')
  for i in $(seq "$RELOADS"); do
    at "$(awk -v i="$i" -v s="$step" 'BEGIN { print i * s - s / 2 }')"
    for g in 1 2; do
      write_config "$g" $((1000 + i))
      code=$(curl -s -o "$run/reload.g$g.body" -w '%{http_code}' -X POST "http://127.0.0.1:${ADM[$g]}/admin/reload") || true
      ver=$(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$run/reload.g$g.body")
      echo "$(now) $g $i $code ${ver:-?}" >>"$run/reloads.log"
    done
  done
}

# --- faults --------------------------------------------------------------------------------
fault() { # name
  local name=$1 tstart tback p tp dp pp=() g
  snap "f-$name-a"
  tstart=$(now)
  log "fault: $name"
  case $name in
    kill*)
      kill -9 "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true
      sleep "${DOWN:-4}"
      start_redis
      for g in 1 2; do first_decided "$g" "$run/faults/$name.g$g" & pp+=($!); done
      tback=$(wait_pong) ;;
    pause)
      rcli CLIENT PAUSE 2000 >/dev/null
      for g in 1 2; do first_decided "$g" "$run/faults/$name.g$g" & pp+=($!); done
      rcli PING >/dev/null; tp=$(now) # blocked until the pause ends
      tback=$(awk -v a="$tp" -v b="$tstart" 'BEGIN { printf "%.6f", (a > b + 2) ? a : b + 2 }') ;;
    sleep)
      rcli DEBUG SLEEP 1 >/dev/null & dp=$!
      sleep 0.05
      for g in 1 2; do first_decided "$g" "$run/faults/$name.g$g" & pp+=($!); done
      rcli PING >/dev/null; tback=$(now) # queued behind the sleep
      wait "$dp" || true ;;
    flushall | scriptflush)
      if [[ $name == flushall ]]; then rcli FLUSHALL >/dev/null
      else rcli FUNCTION FLUSH >/dev/null; rcli SCRIPT FLUSH >/dev/null; fi
      tback=$(now)
      for g in 1 2; do first_decided "$g" "$run/faults/$name.g$g" & pp+=($!); done ;;
  esac
  wait "${pp[@]}" || true
  sleep 1
  snap "f-$name-b"
  rcli INFO errorstats | tr -d '\r' | sed -n 's/^errorstat_\([^:]*\):count=\([0-9]*\).*/\1=\2/p' | paste -sd' ' >"$run/faults/$name.errorstats" || true
  echo "$name $tstart $tback $(cat "$run/faults/$name.g1") $(cat "$run/faults/$name.g2") $(now)" >>"$run/faults.txt"
  log "fault: $name over (redis back at $(rel "$tback")s)"
}

# --- the soak ------------------------------------------------------------------------------
cat >"$run/count.lua" <<'LUA'
-- Alternate /allow and /deny (one API key each); count answers by status.
local reqs, i = {}, 0
statuses = {}
init = function(args)
  reqs[1] = wrk.format("GET", "/allow", { ["X-Api-Key"] = "soak-allow" })
  reqs[2] = wrk.format("GET", "/deny", { ["X-Api-Key"] = "soak-deny" })
end
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
response = function(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
local threads = {}
setup = function(thread) table.insert(threads, thread) end
done = function(summary, latency, requests)
  local all = {}
  for _, t in ipairs(threads) do
    for s, n in pairs(t:get("statuses")) do all[s] = (all[s] or 0) + n end
  end
  for s, n in pairs(all) do io.write(string.format("SOAK status %d %d\n", s, n)) end
  local e = summary.errors
  io.write(string.format("SOAK requests %d\nSOAK max_us %d\nSOAK p99_us %d\n", summary.requests, latency.max, latency:percentile(99)))
  io.write(string.format("SOAK errors connect=%d read=%d write=%d timeout=%d status=%d\n", e.connect, e.read, e.write, e.timeout, e.status))
end
LUA

exact_check pre "pre-$$"
snap start
T0=$(now)
log "load: wrk -t1 -c$WRK_CONN -d${D}s on each gateway; faults, probes and $RELOADS reloads per gateway"
for g in 1 2; do
  nice -n "$LOAD_NICE" wrk -t1 -c"$WRK_CONN" -d"${D}s" --timeout 3s -s "$run/count.lua" "http://127.0.0.1:${GWP[$g]}" >"$run/wrk.g$g.txt" 2>&1 & pids+=($!)
  wrkpid[$g]=$!
done
for g in 1 2; do probe_loop "$g" & pids+=($!); done
touch "$run/stalls.log"; stall_loop & pids+=($!)
psi0=$(psi_cpu); io0=$(psi_io); read -r busy0 soak0 < <(cpu_ticks)
reloader & pids+=($!); reloadpid=$!

at 2;  exact_check load-1 "l1-$$"
at 6;  DOWN=4 fault kill-4s
at 16; exact_check after-restart "l2-$$"
at 20; (sleep 1.3; exact_check pause-end "l3-$$" 60/s) & ep=$!; fault pause; wait "$ep" || true
at 28; fault sleep
at 34; fault flushall
at 37; exact_check after-flushall "l4-$$"
at 41; fault scriptflush
at 45; DOWN=2 fault kill-2s
at 53; exact_check load-2 "l5-$$"
wait "${wrkpid[1]}" "${wrkpid[2]}" || true
wait "$reloadpid" || true
snap end
psi1=$(psi_cpu); io1=$(psi_io); T1=$(now); read -r busy1 soak1 < <(cpu_ticks)
touch "$run/stop"
sleep 0.5
rcli FLUSHALL >/dev/null
exact_check end "end-$$"
log "load over"

# --- summary -------------------------------------------------------------------------------
# Metric deltas between two snapshots: "series delta" per line.
delta() {
  awk 'NR == FNR { if ($0 !~ /^#/ && NF == 2) b[$1] = $2; next }
       $0 !~ /^#/ && NF == 2 { printf "%s %.10g\n", $1, $2 - (($1 in b) ? b[$1] : 0) }' "$1" "$2"
}
LAB='function lab(s, k) { if (match(s, k "=\"[^\"]*\"")) return substr(s, RSTART + length(k) + 2, RLENGTH - length(k) - 3); return "" }
'
fail=()

echo
echo "## Sluice fault soak: 2 gateways (workers: 1) on one Redis $(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/'), ${D}s"
echo
echo "wrk -t1 -c$WRK_CONN per gateway (alternating /allow and /deny); store timeout ${TIMEOUT_MS} ms, so the longest answer allowed is ${LIMIT_MS} ms; run directory \`$run\`."
echo
echo "### Load, per gateway (sluice_requests_total deltas over the wrk run; wrk's own counts)"
echo
echo "| gateway | requests | 200 | 429 | 503 | other | wrk requests | wrk statuses | wrk socket errors | wrk max latency | histogram: longest answer | histogram: answers > ${LIMIT_MS} ms | store calls > ${LIMIT_MS} ms | probe answers | probe max | probe non-decided (503 / failed) | reloads (POST 200 / metric success / error) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for g in 1 2; do
  delta "$run/metrics/start.g$g.prom" "$run/metrics/end.g$g.prom" >"$run/metrics/delta.g$g"
  read -r tot s200 s429 s503 oth hmax hover sover < <(awk "$LAB"'
    /^sluice_requests_total\{/ { o = lab($1, "outcome"); t += $2
      if (o == "forwarded" || o == "store_error_allowed" || o == "shadow_limited") a += $2
      else if (o == "limited") l += $2; else if (o == "store_error_denied") d += $2; else x += $2 }
    /^sluice_request_duration_seconds_bucket\{/ { le = lab($1, "le"); c[le] += $2 }
    /^sluice_request_duration_seconds_count/ { n += $2 }
    /^sluice_store_duration_seconds_bucket\{/ && lab($1, "le") == "0.1" { s1 += $2 }
    /^sluice_store_duration_seconds_count/ { sn += $2 }
    END {
      best = "+Inf"; prev = 0; bv = 1e99
      for (le in c) { v = (le == "+Inf") ? 1e99 : le + 0; if (c[le] >= n && v < bv) { bv = v; best = le } }
      for (le in c) { v = (le == "+Inf") ? 1e99 : le + 0; if (v < bv && v > prev) prev = v }
      over = n - c["0.1"]
      printf "%d %d %d %d %d %s %d %d\n", t, a, l, d, x, (n == 0 ? "-" : sprintf("(%gms,%s]", prev * 1000, best == "+Inf" ? "+Inf" : (best * 1000) "ms")), over, sn - s1 }' "$run/metrics/delta.g$g")
  wreq=$(awk '$1 == "SOAK" && $2 == "requests" { print $3 }' "$run/wrk.g$g.txt")
  wst=$(awk '$1 == "SOAK" && $2 == "status" { printf "%s%s: %s", sep, $3, $4; sep = ", " }' "$run/wrk.g$g.txt")
  werr=$(awk '$1 == "SOAK" && $2 == "errors" { print $3, $4, $5, $6 }' "$run/wrk.g$g.txt")
  wmax=$(awk '$1 == "SOAK" && $2 == "max_us" { printf "%.1f ms", $3 / 1000 }' "$run/wrk.g$g.txt")
  read -r pn pmax pbad pfail < <(awk '{ n++; if ($5 + 0 > m) m = $5 + 0; if ($4 == "503") b++; if ($4 == "000") f++ }
    END { printf "%d %.1f %d %d\n", n, m * 1000, b, f }' "$run/probe.g$g.log")
  rok=$(awk -v g="$g" '$2 == g && $4 == 200' "$run/reloads.log" | wc -l)
  rsucc=$(awk '/^sluice_config_reloads_total\{result="success"\}/ { print $2 }' "$run/metrics/delta.g$g")
  rerr=$(awk '/^sluice_config_reloads_total\{result="error"\}/ { print $2 }' "$run/metrics/delta.g$g")
  echo "| gw$g | $tot | $s200 | $s429 | $s503 | $oth | ${wreq:-?} | ${wst:-?} | ${werr:-?} | ${wmax:-?} | $hmax | $hover | $sover | $pn | $pmax ms | $pbad / $pfail | $rok of $RELOADS / $rsucc / $rerr |"
  if awk -v m="$pmax" -v l="$LIMIT_MS" 'BEGIN { exit !(m > l) }'; then
    fail+=("gw$g: the probe waited $pmax ms for an answer (limit $LIMIT_MS ms)")
  fi
  ((pfail == 0)) || fail+=("gw$g: $pfail probe requests got no answer within 5 s")
  ((rok == RELOADS)) || echo "WARN gw$g: only $rok of $RELOADS reloads answered 200" >&2
done
echo
echo "wrk runs at nice $LOAD_NICE, so its latency also counts the time wrk itself waited for a CPU; the probe and the gateway histogram do not. Each of the $RELOADS reloads rewrites the file (renamed over it, so the watcher reloads) and POSTs /admin/reload: the success metric counts up to two per reload. \"store calls > ${LIMIT_MS} ms\" (sluice_store_duration_seconds) can only exceed the ${TIMEOUT_MS} ms timeout when the gateway's thread did not run."
echo
echo "Per route (outcomes of sluice_requests_total over the wrk run, exact checks included):"
echo
echo "| gateway | route | forwarded | store_error_allowed | store_error_denied | limited | other |"
echo "|---|---|---|---|---|---|---|"
for g in 1 2; do
  awk -v g="$g" "$LAB"'
    /^sluice_requests_total\{/ { r = lab($1, "route"); o = lab($1, "outcome"); if (r == "_none") next; seen[r] = 1
      if (o == "forwarded" || o == "store_error_allowed" || o == "store_error_denied" || o == "limited") v[r, o] += $2; else v[r, "other"] += $2 }
    END { n = split("allow deny exact-fw exact-sl knob", rs, " ")
      for (i = 1; i <= n; i++) { r = rs[i]; if (!(r in seen)) continue
        printf "| gw%s | %s | %d | %d | %d | %d | %d |\n", g, r, v[r, "forwarded"], v[r, "store_error_allowed"], v[r, "store_error_denied"], v[r, "limited"], v[r, "other"] } }' "$run/metrics/delta.g$g"
done

echo
echo "### Faults (times in seconds after the load started)"
echo
echo "\"Redis back\": the first PONG after a restart, the end of the pause, or PING returning after DEBUG SLEEP."
echo "\"limiting resumed\": from Redis back to the first answer on /deny decided by the store (200), polled every ~10 ms."
echo "Policy answers and store errors: metric deltas from the fault until 1 s after both gateways resumed. Redis error replies: its INFO errorstats (reset by each restart)."
echo
echo "| fault | at | Redis back | gw1 limiting resumed after | gw2 limiting resumed after | gw1 policy answers (allowed / denied) | gw2 policy answers | gw1 store errors (timeout / connection / breaker_open / script) | gw2 store errors | gw1 probe max in window | gw2 probe max in window | Redis error replies since its start |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
while read -r name ts tb d1 d2 te; do
  cells=()
  for d in "$d1" "$d2"; do
    if [[ $d == none ]]; then cells+=("never (20 s)"); fail+=("$name: limiting did not resume within 20 s")
    else cells+=("$(awk -v a="${d%,*}" -v r="${d#*,}" -v b="$tb" 'BEGIN { printf "%.3f s (that answer took %.0f ms)", a - b, r * 1000 }')"); fi
  done
  for g in 1 2; do
    delta "$run/metrics/f-$name-a.g$g.prom" "$run/metrics/f-$name-b.g$g.prom" >"$run/metrics/f-$name.delta.g$g"
    cells+=("$(awk "$LAB"'/^sluice_requests_total\{/ { o = lab($1, "outcome"); if (o == "store_error_allowed") a += $2; if (o == "store_error_denied") d += $2 }
      END { printf "%d / %d", a, d }' "$run/metrics/f-$name.delta.g$g")")
  done
  for g in 1 2; do
    cells+=("$(awk "$LAB"'/^sluice_store_errors_total\{/ { e[lab($1, "kind")] = $2 }
      END { printf "%d / %d / %d / %d", e["timeout"], e["connection"], e["breaker_open"], e["script"] }' "$run/metrics/f-$name.delta.g$g")")
  done
  for g in 1 2; do
    cells+=("$(awk -v a="$ts" -v b="$te" '$1 >= a && $1 <= b && $5 + 0 > m { m = $5 + 0 } END { printf "%.1f ms", m * 1000 }' "$run/probe.g$g.log")")
  done
  es=$(cat "$run/faults/$name.errorstats" 2>/dev/null); cells+=("${es:-none}")
  printf '| %s | %s | %s |' "$name" "$(rel "$ts")" "$(rel "$tb")"
  printf ' %s |' "${cells[@]}"
  echo
done <"$run/faults.txt"

echo
echo "### Host and slow answers"
echo
if [[ -n ${psi0:-} && -n ${psi1:-} ]]; then
  echo "- CPU pressure over the load (PSI \`some\`): $(awk -v a="$psi0" -v b="$psi1" -v t0="$T0" -v t1="$T1" 'BEGIN { printf "%.0f%%", (b - a) / ((t1 - t0) * 1e6) * 100 }') of the time some runnable task waited for a CPU ($(nproc) CPUs; the soak itself runs 2 gateways, 2 wrk, Redis and the upstream)."
fi
if [[ -n ${io0:-} && -n ${io1:-} ]]; then
  echo "- I/O pressure over the load (PSI \`full\`): $(awk -v a="$io0" -v b="$io1" 'BEGIN { printf "%.2f s", (b - a) / 1e6 }') during which every task waited on I/O (gateway logs are files in the run directory)."
fi
awk -v b="$((busy1 - busy0))" -v s="$((soak1 - soak0))" -v hz="$(getconf CLK_TCK)" -v t0="$T0" -v t1="$T1" -v n="$(nproc)" \
  'BEGIN { t = t1 - t0; printf "- CPU over the load (%.0f s x %d CPUs = %.0f CPU-s): this soak %.0f CPU-s, other processes on the host %.0f CPU-s (%.0f%% of the machine).\n", t, n, t * n, s / hz, (b - s) / hz, (b - s) / hz / (t * n) * 100 }'
echo "- Host scheduling stalls (a 20 ms timed wait overshooting by > 20 ms): $(awk '{ n++; if ($2 > 50000) b++; if ($2 > m) m = $2 } END { printf "%d, %d of them > 50 ms, longest %.0f ms", n, b, m / 1000 }' "$run/stalls.log")."
slow=0
for g in 1 2; do
  while read -r ps pe pr pc pt pid; do
    if ((slow == 0)); then
      echo
      echo "Probe answers slower than ${LIMIT_MS} ms (gateway view from its access log, by X-Request-Id):"
      echo
      echo "| gateway | at | route | status | probe time | gateway duration | gateway decision | longest host stall overlapping |"
      echo "|---|---|---|---|---|---|---|---|"
    fi
    slow=$((slow + 1))
    line=$(grep -F "\"request_id\":\"$pid\"" "$run/gw$g.log" | head -1)
    gd=$(sed -n 's/.*"duration_us":\([0-9]*\).*/\1/p' <<<"$line")
    dec=$(sed -n 's/.*"decision":"\([^"]*\)".*/\1/p' <<<"$line")
    st=$(awk -v a="$ps" -v b="$pe" '{ e = $1 / 1e6; s = e - ($2 + 20000) / 1e6; if (s <= b && e >= a && $2 > m) m = $2 } END { printf "%.0f ms", m / 1000 }' "$run/stalls.log")
    echo "| gw$g | $(rel "$ps")s | $pr | $pc | $(awk -v t="$pt" 'BEGIN { printf "%.1f ms", t * 1000 }') | ${gd:+$(awk -v d="$gd" 'BEGIN { printf "%.1f ms", d / 1000 }')} | ${dec:-not logged} | $st |"
  done < <(awk -v l="$LIMIT_MS" '$5 * 1000 > l' "$run/probe.g$g.log")
done
((slow)) || echo "- No probe answer took longer than ${LIMIT_MS} ms."

echo
echo "### Exact-limit routes (N = $N per hour, fresh key per check, $EXACT_SEND requests per gateway and route, both gateways at once)"
echo
echo "| check | at | route | sent (gw1 + gw2) | admitted (gw1 + gw2) | 429 | 503 | other | N | verdict |"
echo "|---|---|---|---|---|---|---|---|---|---|"
while read -r label; do
  read -r t0 _ straddle <"$run/exact/$label.meta"
  for r in exact-fw exact-sl; do
    read -r sent a1 a2 lim den oth < <(awk 'FILENAME ~ /g1$/ && $1 == 200 { a1++ } FILENAME ~ /g2$/ && $1 == 200 { a2++ }
      { n++; if ($1 == 429) l++; else if ($1 == 503) d++; else if ($1 != 200) o++ }
      END { printf "%d %d %d %d %d %d\n", n, a1, a2, l, d, o }' "$run/exact/$label.$r.g1" "$run/exact/$label.$r.g2")
    adm=$((a1 + a2))
    if ((adm > N)) && [[ $r == exact-fw && $straddle == 1 ]]; then
      verdict="window boundary crossed ($adm <= 2N allowed)"
      ((adm <= 2 * N)) || { verdict="OVER-ADMISSION by $((adm - 2 * N))"; fail+=("$label $r: admitted $adm > 2N across a window boundary"); }
    elif ((adm > N)); then
      verdict="OVER-ADMISSION by $((adm - N))"; fail+=("$label $r: admitted $adm > N = $N")
    elif ((den == 0 && oth == 0 && sent >= N && adm != N)); then
      verdict="UNDER-ADMISSION: $adm < N with Redis healthy"; fail+=("$label $r: admitted $adm, N = $N, no store error")
    elif ((den > 0 || oth > 0)); then
      verdict="ok (<= N; store failed for some)"
    else
      verdict="ok (= N)"
    fi
    echo "| $label | $([[ $label == pre ]] && echo before || rel "$t0") | $r | $sent | $adm ($a1 + $a2) | $lim | $den | $oth | $N | $verdict |"
  done
done <"$run/exact/order"

echo
if ((${#fail[@]})); then
  echo "**FAIL**"
  printf -- '- %s\n' "${fail[@]}"
  status=1
else
  echo "**PASS**: no over-admission, every probe answer within ${LIMIT_MS} ms, limiting resumed after every fault."
  status=0
fi
echo
echo "Logs, configs, metrics snapshots and raw probe/exact-check data: \`$run\`"
exit $status
