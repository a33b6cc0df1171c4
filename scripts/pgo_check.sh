#!/usr/bin/env bash
# Does the committed profile apply to a release binary?
#   scripts/pgo_check.sh [BINARY]     (default: sluice in cargo's target directory)
# LLVM finds a function's counts by its symbol name, and a Rust symbol's name carries a hash
# of its crate's `-C metadata`, which cargo derives from the build: the toolchain, every
# dependency's version and features among other things (a cargo run that also builds an
# example unifies the dev-dependencies' features in). A profile trained on a build that
# differs so names none of the binary's functions: the build then is profile-guided in name
# only, and nothing warns. This counts the sluice crate's functions in BINARY that the profile
# has counts for (pgo/sluice.functions, written with the profile by scripts/pgo.sh), and fails
# below half. scripts/test.sh runs it on a release build, so CI fails when a change (a
# dependency upgrade, a new toolchain) leaves the profile behind.
# (A profile made before later code changes still names most: functions keep their names
# when their bodies change; LLVM drops the counts of a changed body by its own hash.)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
bin=${1:-$(target_dir)/release/sluice}
[ -x "$bin" ] || { echo "$bin not found: scripts/build_release.sh" >&2; exit 1; }
command -v nm >/dev/null || { echo "nm not found: apt-get install -y binutils" >&2; exit 1; }

ours=$(nm "$bin" | sluice_functions || true) # none: grep fails, and so does the check below
total=$(grep -c . <<<"$ours" || true)
found=$(comm -12 pgo/sluice.functions - <<<"$ours" | grep -c . || true)
echo "pgo/sluice.profdata has counts for $found of the $total sluice functions in $bin"
if [ "$total" -eq 0 ] || [ $((2 * found)) -lt "$total" ]; then
  echo "the profile does not apply to this build: remake it with scripts/pgo.sh" >&2
  exit 1
fi
