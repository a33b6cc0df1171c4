#!/usr/bin/env bash
# Long fuzzing campaigns over the targets of tests/fuzz.rs: each target runs again and again
# with a fresh seed and SLUICE_FUZZ_CASES cases per run, for about SECONDS per target. The
# first failure stops the campaign and prints the command that replays it (same seed, same
# case count); add its minimal input to tests/corpus/<target>/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET (300)] [CASES_PER_RUN (20000)] [TARGET...]
#
# TARGET is a test name of tests/fuzz.rs (fuzz_config, fuzz_path, fuzz_client_ip, fuzz_jwt,
# fuzz_api_key, fuzz_cost_header, fuzz_script_args); default: all of them. Builds an optimized
# test binary that keeps overflow checks and debug assertions (an overflow is a finding).
# `cargo test` (scripts/test.sh, CI) runs every target once with its bounded default.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-300}
cases=${2:-20000}
shift $(( $# < 2 ? $# : 2 ))
all=(fuzz_config fuzz_path fuzz_client_ip fuzz_jwt fuzz_api_key fuzz_cost_header fuzz_script_args)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "unknown target $t (one of: ${all[*]})" >&2; exit 2; }
done

export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_PROFILE_RELEASE_LTO=false
cargo test --release --test fuzz --no-run

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
  end=$((SECONDS + secs))
  runs=0
  while [ $SECONDS -lt $end ]; do
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    if ! SLUICE_FUZZ_SEED=$seed SLUICE_FUZZ_CASES=$cases \
      cargo test -q --release --test fuzz -- --exact "$t" --nocapture >"$log" 2>&1; then
      cat "$log"
      echo
      echo "FAILED: $t, seed $seed. Replay with:"
      echo "  SLUICE_FUZZ_SEED=$seed SLUICE_FUZZ_CASES=$cases cargo test --test fuzz -- --exact $t --nocapture"
      exit 1
    fi
    runs=$((runs + 1))
  done
  echo "$t: $runs runs of $cases cases, no failure"
done
