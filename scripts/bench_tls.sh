#!/usr/bin/env bash
# TLS, sluice against nginx in one run, same certificate (ECDSA P-256), same worker count:
#   scripts/bench_tls.sh [DURATION]     (default 10s; WORKERS=2 for two workers each)
# - keep-alive requests/s over TLS: wrk -t1 -c64 (connections stay open: no handshakes);
# - full handshakes/s: two `openssl s_time -new -tls1_3` clients (a new session per
#   connection, no resumption), each connection one GET; also per CPU-second of the server,
#   since the clients share the machine's cores with it.
# Both servers: access log off, keep-alive upstream without a request cap.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10s}
secs=${dur%s}
workers=${WORKERS:-1}
for tool in wrk openssl nginx; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install -y $tool" >&2; exit 1; }
done
. scripts/bench_lib.sh
bench_setup
SL=$(free_port); ADM=$(free_port); NG=$(free_port)
self_signed_cert

cat > "$tmp/sluice.yaml" <<YAML
listen:
  - address: 127.0.0.1:$SL
    tls:
      certificates:
        - { cert: $tmp/tls.crt, key: $tmp/tls.key }
admin_listen: 127.0.0.1:$ADM
workers: $workers
upstreams:
  up: { targets: [http://127.0.0.1:$UP] }
routes:
  - name: plain
    match: { path_prefix: / }
    upstream: up
YAML
RUST_LOG=${RUST_LOG:-info,sluice::access=off} "$rel/sluice" run -c "$tmp/sluice.yaml" 2>/dev/null &
sluice_pid=$!; pids+=($sluice_pid)

{ nginx_head "$workers"
  cat <<NGINX
  server {
    listen 127.0.0.1:$NG ssl;
    http2 on;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate $tmp/tls.crt;
    ssl_certificate_key $tmp/tls.key;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
} > "$tmp/nginx.conf"
# nginx before 1.25.1 has no `http2 on;` (Debian 12 ships 1.22): use `listen … ssl http2`.
if ! nginx -t -c "$tmp/nginx.conf" >/dev/null 2>&1; then
  sed -i -e 's/    http2 on;//' -e "s/listen 127.0.0.1:$NG ssl;/listen 127.0.0.1:$NG ssl http2;/" "$tmp/nginx.conf"
fi
nginx -c "$tmp/nginx.conf" 2>/dev/null & pids+=($!)
sleep 1
nginx_pids() { pgrep -f "nginx: worker process" -P "$(cat "$tmp/nginx.pid")" | tr '\n' ' '; }

for name in sluice nginx; do
  port=$SL; [ "$name" = nginx ] && port=$NG
  code=$(curl -sk -o /dev/null -w '%{http_code}' "https://127.0.0.1:$port/")
  [ "$code" = 200 ] || { echo "$name over TLS answered $code" >&2; exit 1; }
done

# Full handshakes: two s_time clients at once for $secs seconds; the server's CPU over the run.
handshakes() { # port pids... -> "handshakes_per_s handshakes_per_cpu_s"
  local port=$1; shift
  local before after n=0
  before=$(for p in "$@"; do cpu_seconds "$p"; done | awk '{s+=$1} END {print s}')
  for i in 1 2; do
    openssl s_time -connect "127.0.0.1:$port" -new -tls1_3 -time "$secs" -www / >"$tmp/st$i" 2>&1 &
  done
  wait %-1 %-2 2>/dev/null || wait
  after=$(for p in "$@"; do cpu_seconds "$p"; done | awk '{s+=$1} END {print s}')
  n=$(awk '/connections in [0-9]+ real seconds/ {s+=$1} END {print s+0}' "$tmp/st1" "$tmp/st2")
  awk -v n="$n" -v t="$secs" -v c="$(awk -v a="$before" -v b="$after" 'BEGIN{print b-a}')" \
    'BEGIN{printf "%.0f %.0f\n", n/t, (c > 0 ? n/c : 0)}'
}

printf '%-40s %12s %10s\n' "TLS ($workers worker(s) each)" sluice nginx
read -r s_rps s_p99 < <(run sluice "https://127.0.0.1:$SL/")
read -r n_rps n_p99 < <(run nginx "https://127.0.0.1:$NG/")
printf '%-40s %12.0f %10.0f   ratio %.2f\n' "keep-alive requests/s" "$s_rps" "$n_rps" "$(awk -v a="$s_rps" -v b="$n_rps" 'BEGIN{print a/b}')"
printf '%-40s %12.2f %10.2f\n' "keep-alive p99 ms" "$s_p99" "$n_p99"
read -r s_hs s_hc < <(handshakes "$SL" "$sluice_pid")
# shellcheck disable=SC2046
read -r n_hs n_hc < <(handshakes "$NG" $(nginx_pids))
printf '%-40s %12.0f %10.0f   ratio %.2f\n' "full handshakes/s (TLS 1.3, 2 clients)" "$s_hs" "$n_hs" "$(awk -v a="$s_hs" -v b="$n_hs" 'BEGIN{print (b>0?a/b:0)}')"
printf '%-40s %12.0f %10.0f   ratio %.2f\n' "full handshakes per server CPU-second" "$s_hc" "$n_hc" "$(awk -v a="$s_hc" -v b="$n_hc" 'BEGIN{print (b>0?a/b:0)}')"
