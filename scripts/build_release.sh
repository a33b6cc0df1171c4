#!/usr/bin/env bash
# Build the release binaries the way every script here, the Dockerfile and CI do, and print
# the directory that holds them (cargo's target directory, which CARGO_TARGET_DIR moves):
#   rel=$(scripts/build_release.sh [--strict] [CARGO-ARGS...])
# $rel/sluice, then $rel/examples/demo_upstream, each in a cargo run of its own: built in
# one run, the example's dev-dependencies would have cargo unify their features into crates
# sluice shares with them, changing those crates' `-C metadata` and so every symbol name in
# the binary, and the committed profile (pgo/sluice.profdata), which LLVM matches to
# functions by name, would apply to none of sluice's code. Then scripts/pgo_check.sh says
# whether the profile applies to the binary: a warning when it does not (another toolchain
# than the one in pgo/sluice.meta, say), an error with --strict. Release crates built with
# another profile, or without one (SLUICE_PGO=off), are cleaned away first: cargo does not
# know the profile is an input of every crate. Cargo options that would build somewhere else
# than the printed directory (--target, --target-dir, --profile, --artifact-dir) are refused:
# the profile is of this host's build, and the callers run what this prints.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
strict=0
if [ "${1:-}" = --strict ]; then strict=1; shift; fi
for a in "$@"; do
  case "$a" in
  --target | --target=* | --target-dir | --target-dir=* | --profile | --profile=* | --artifact-dir | --artifact-dir=* | --out-dir | --out-dir=*)
    echo "build_release.sh: $a builds elsewhere than the release directory this prints" \
      "(CARGO_TARGET_DIR moves that directory)" >&2
    exit 2
    ;;
  esac
done
rel="$(target_dir)/release"
clean_if_profile_changed "$rel"
cargo build --release "$@" --bin sluice
cargo build --release "$@" --example demo_upstream
mark_profile "$rel"
if ! scripts/pgo_check.sh "$rel/sluice" >&2; then
  [ "$strict" -eq 0 ] || exit 1
  echo "warning: this sluice is built without its profile in effect (made with" \
    "$(sed -n 's/^rustc=//p' pgo/sluice.meta); this is $(rustc -V)): about a quarter more" \
    "instructions per request (docs/performance.md, \"Profile-guided builds\")" >&2
fi
echo "$rel"
