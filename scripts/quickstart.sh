#!/usr/bin/env bash
# Build sluice and the demo upstream, start the upstream on 127.0.0.1:3000, and run the
# gateway in the foreground with config/sluice.yaml (embedded store). Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
rel=$(scripts/build_release.sh)
"$rel/examples/demo_upstream" 127.0.0.1:3000 &
up=$!
trap 'kill $up 2>/dev/null' EXIT
exec_status=0
"$rel/sluice" run -c config/sluice.yaml --log-format human || exec_status=$?
exit $exec_status
