# Shared by scripts/bench.sh and scripts/bench_tls.sh (sourced, not run).

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
