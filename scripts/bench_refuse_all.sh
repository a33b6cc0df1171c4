#!/usr/bin/env bash
# An extra sluice target for the maintainers' peer rig: the 429 path like with like.
#   bench_refuse_all.sh BIN        (the rig runs it with BENCH_PORT, BENCH_UPSTREAM, BENCH_RUNDIR)
#
# The rig's own `sluice-memory` target limits /deny to 1 per second per key. Under its load
# (10 000 keys, about ten requests per key per second) sluice admits exactly that one and
# forwards it: about one request in nine goes upstream. HAProxy's stick table counts refused
# requests too, so a key asked more than once a second never drops under its limit, and its
# /deny row forwards nothing. A forwarded request costs about twice a refusal, so the two rows
# compare unequal work. Here /deny is 1 per 1000 s (burst 1): after a key's first request
# every request is refused, as HAProxy's are. Everything else is the rig's configuration.
#
#   compare.sh --repeat 3 \
#     --target "sluice-refuse-all=$PWD/scripts/bench_refuse_all.sh $PWD/target/release/sluice@18094" \
#     --target-deny sluice-refuse-all=/deny
set -euo pipefail
bin=$1
cfg="$BENCH_RUNDIR/sluice-refuse-all-$BENCH_PORT.yaml"
cat > "$cfg" <<YAML
listen: 127.0.0.1:$BENCH_PORT
admin_listen: 127.0.0.1:$((BENCH_PORT + 1000))
workers: ${BENCH_WORKERS:-1}
store: { kind: memory }
upstreams: { origin: { targets: ["http://$BENCH_UPSTREAM"] } }
routes:
  - name: deny
    match: { path: /deny }
    upstream: origin
    limits: [ { name: k, by: api_key, on_missing: ip, algorithm: token_bucket, rate: 1/1000s, burst: 1 } ]
  - name: pass
    match: { path_prefix: / }
    upstream: origin
    limits: [ { name: k, by: api_key, on_missing: ip, algorithm: token_bucket, rate: 10000000/1s, burst: 10000000 } ]
YAML
export RUST_LOG="${SLUICE_BENCH_LOG:-info,sluice::access=off}"
exec "$bin" run -c "$cfg" --log-format json
