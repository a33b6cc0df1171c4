#!/usr/bin/env bash
# Does the committed profile apply to a release binary?
#   scripts/pgo_check.sh [BINARY]     (default target/release/sluice)
# LLVM finds a function's counts by its symbol name, and a Rust symbol's name carries a hash
# of its crate's `-C metadata`, which cargo derives from the build: every dependency's
# features among other things (a cargo run that also builds an example unifies the
# dev-dependencies' features in). A profile trained on a build that differs so names none of
# the binary's functions: the build then is profile-guided in name only, and nothing warns. This counts
# the sluice crate's functions in BINARY that the profile names, and fails below half.
# (A profile made before later code changes still names most: functions keep their names
# when their bodies change; LLVM drops the counts of a changed body by its own hash.)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/sluice}
. scripts/bench_lib.sh
profdata=$(llvm_profdata)
[ -x "$bin" ] || { echo "$bin not found: cargo build --release" >&2; exit 1; }

names() { grep -oE '_ZN6sluice[0-9A-Za-z_$.]*17h[0-9a-f]{16}E' | sort -u; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$profdata" show --all-functions pgo/sluice.profdata | names > "$tmp/profile"
nm "$bin" | names > "$tmp/binary"
found=$(comm -12 "$tmp/profile" "$tmp/binary" | wc -l)
total=$(wc -l < "$tmp/binary")
echo "pgo/sluice.profdata names $found of the $total sluice functions in $bin"
if [ "$total" -eq 0 ] || [ $((2 * found)) -lt "$total" ]; then
  echo "the profile does not apply to this build: remake it with scripts/pgo.sh" >&2
  exit 1
fi
