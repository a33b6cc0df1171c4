#!/usr/bin/env bash
# Run the whole test suite: installs what the tests need (real redis-server, redis-sentinel,
# prometheus, faketime, curl, openssl, prlimit), then formatting, clippy, doc links, every test, and a
# release build whose profile must apply (scripts/build_release.sh --strict).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for bin in redis-server:redis-server redis-cli:redis-tools redis-sentinel:redis-sentinel prometheus:prometheus faketime:faketime curl:curl openssl:openssl prlimit:util-linux; do
  command -v "${bin%%:*}" >/dev/null 2>&1 || need+=("${bin##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# Doc links are checked too: a renamed module must not leave the docs pointing at nothing.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --all-targets 2>&1 | tee "$log"
# One closing line for the whole run (cargo's own last line is that of its last target).
awk '/^test result:/ {p += $4; f += $6} END {printf "all targets: %d passed, %d failed\n", p, f}' "$log"
# The release build, as the Dockerfile and the scripts make it, with the committed profile in
# effect: it fails when a change (a dependency, the toolchain, how the build is run) leaves
# the profile naming too few of the binary's functions for LLVM to apply it.
scripts/build_release.sh --strict --locked --quiet
