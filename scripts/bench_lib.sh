# Shared by scripts/build_release.sh, the bench scripts, soak.sh, pgo.sh and pgo_check.sh
# (sourced, not run).

# The sluice crate's function symbols in text on stdin (`nm`, `llvm-profdata show`), one
# per line, sorted: what scripts/pgo_check.sh compares between a binary and the profile.
sluice_functions() { grep -oE '_ZN6sluice[0-9A-Za-z_$.]*17h[0-9a-f]{16}E' | sort -u; }

# The toolchain's llvm-profdata (rustup's llvm-tools), or exit saying how to get it.
llvm_profdata() {
  local host tool
  host=$(rustc -vV | sed -n 's/^host: //p')
  tool="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
  [ -x "$tool" ] || { echo "llvm-profdata not found: rustup component add llvm-tools" >&2; exit 1; }
  echo "$tool"
}

# Where cargo builds this tree (CARGO_TARGET_DIR, a cargo config's `build.target-dir`, or
# ./target): the binaries scripts/build_release.sh made, never a stale ./target/release.
target_dir() { cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'; }

# What scripts/rustc-pgo compiles release crates with: the committed profile's SHA-256, or
# `off` (SLUICE_PGO=off, or no profile).
profile_stamp() {
  if [ "${SLUICE_PGO:-on}" = off ] || [ ! -f pgo/sluice.profdata ]; then echo off; return; fi
  sha256sum pgo/sluice.profdata | cut -d' ' -f1
}

# Cargo does not see the profile the wrapper adds, so it would keep release crates compiled
# with another profile, or none: start the release directory $1 over unless it was built with
# this one (its `.sluice-profile`, which `mark_profile` writes after a build, says). A release
# directory without one was built before that record existed, with no telling which profile.
clean_if_profile_changed() { # release-dir
  [ -d "$1" ] || return 0
  [ "$(cat "$1/.sluice-profile" 2>/dev/null)" != "$(profile_stamp)" ] || return 0
  echo "$1 was not built with this profile (pgo/sluice.profdata, SLUICE_PGO): cargo clean --release" >&2
  cargo clean --release --quiet
}
mark_profile() { profile_stamp > "$1/.sluice-profile"; } # release-dir

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wrk -t1 -c64 for $dur on a URL: prints "requests_per_second p99_ms".
run() { # name url
  local out rps p99
  out=$(wrk -t1 -c64 -d"$dur" --latency "$2")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub("us","",v); v=v/1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v=v*1000}; print v}' <<<"$out")
  echo "$rps $p99"
}

# CPU seconds (user + system) a process has used so far.
cpu_seconds() { # pid
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}

# CPU seconds several processes have used so far, together.
cpu_total() { # pid...
  local t=0 p
  for p in "$@"; do t=$(awk -v a="$t" -v b="$(cpu_seconds "$p")" 'BEGIN{print a+b}'); done
  echo "$t"
}

# wrk -t1 -c64 for $dur with a random key of $KEYS (default 10 000) per request
# (scripts/wrk_keys.lua, as the peer rig does; KEYS=0: no key, every request from one client):
# prints "requests_per_second p99_ms requests_per_cpu_second", the CPU being that of the given
# processes together.
runk() { # url pid...
  local url=$1 keys=${KEYS:-10000} out rps p99 total c0 c1 script=()
  shift
  if [ "$keys" -gt 0 ]; then script=(-s scripts/wrk_keys.lua); fi
  c0=$(cpu_total "$@")
  out=$(KEYS=$keys wrk -t1 -c64 -d"$dur" --latency "${script[@]}" "$url")
  c1=$(cpu_total "$@")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub("us","",v); v=v/1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v=v*1000}; print v}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  echo "$rps $p99 $(awk -v n="$total" -v a="$c0" -v b="$c1" 'BEGIN{print (b>a ? n/(b-a) : 0)}')"
}

# The median of its arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

# Check for wrk, build the release binaries (into $rel), make $tmp (removed on exit, with every
# pid in $pids killed), and start the demo upstream on $UP.
bench_setup() {
  command -v wrk >/dev/null || { echo "wrk not found: apt-get install -y wrk" >&2; exit 1; }
  rel=$(scripts/build_release.sh --quiet)
  UP=$(free_port)
  tmp=$(mktemp -d)
  pids=()
  trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"' EXIT
  "$rel/examples/demo_upstream" "127.0.0.1:$UP" 2>/dev/null & pids+=($!)
}

# A self-signed ECDSA P-256 certificate for localhost: $tmp/tls.crt and $tmp/tls.key.
self_signed_cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -keyout "$tmp/tls.key" -out "$tmp/tls.crt" -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost" 2>/dev/null
}

# The head of an nginx.conf as the peer rig writes it: $1 workers, access log off, keep-alive
# clients and upstream without a request cap; the caller adds its servers and closes `http`.
nginx_head() { # workers
  cat <<NGINX
worker_processes $1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  client_body_temp_path $tmp; proxy_temp_path $tmp; fastcgi_temp_path $tmp; uwsgi_temp_path $tmp; scgi_temp_path $tmp;
  upstream up { server 127.0.0.1:$UP; keepalive 1024; keepalive_requests 10000000; }
NGINX
}
