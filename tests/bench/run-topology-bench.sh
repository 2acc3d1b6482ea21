#!/bin/bash
# run-topology-bench.sh: the membership protocol's cost at 2, 4 and 8 daemons on loopback.
#
#   tests/bench/run-topology-bench.sh [--smoke] [BUILD_DIR] [-- BENCH_ARGS...]
#
# BUILD_DIR (default: build-bench under the source root) is configured as a release build
# without sanitizers and built when it does not exist yet: numbers from an ASan build mean
# little. FAMILYD_BIN and FAMILYD_DESCRIPTORS, when set (meson test sets them), name the daemon
# and the descriptor set instead. topology-bench.py (run with the Python environment .venv/: grpcio)
# starts and stops the daemons itself through tests/integration/cluster_harness.py, so the
# single-daemon helpers of bench-daemon.sh do not apply; every daemon must still exit 0 on
# SIGTERM. UCX runs over tcp on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo unless already set).
#
# The full run (about 6 minutes) prints convergence time, traffic per heartbeat interval, idle
# CPU and what the cluster key costs (joins and idle CPU, keyed against plain); add
# `-- --check-goals` to fail when a goal is missed, `-- --json FILE`
# for the raw numbers. --smoke: --quick (2 and 4 daemons, 5 s idle windows), a check that the
# tables, ratios and goal are printed and that the daemons stop cleanly; the goal is not
# enforced.

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${FAMILYD_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
me=run-topology-bench.sh
. "$here/bench-daemon.sh"
bench_parse_args 19 "$@"

# The "bench" here is the descriptor set the Python clients read.
familyd=${FAMILYD_BIN:-}
bench=${FAMILYD_DESCRIPTORS:-}
bench_build proto/familyd.binpb
descriptors=$bench

# The bench spawns daemons for minutes: it runs copies, so that a rebuild of the tree meanwhile
# (ninja relinks familyd in place) cannot give one run two different daemons.
tmp=$(mktemp -d "/tmp/fd-topobench-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$familyd" "$tmp/familyd"
cp "$descriptors" "$tmp/familyd.binpb"
out=$tmp/bench.out

export FAMILYD_BIN=$tmp/familyd FAMILYD_DESCRIPTORS=$tmp/familyd.binpb FAMILYD_SOURCE_ROOT=$root
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

if [ "$smoke" = 1 ]; then
        bench_args=(--quick "${bench_args[@]}")
fi

echo "$me: familyd $familyd (run from a copy in $tmp)"
status=0
"$(bash "$here/../../deploy/dev/python-env.sh" --print)" "$here/topology-bench.py" "${bench_args[@]}" | tee "$out" || status=$?
if [ "$status" != 0 ]; then
        # 77: the harness found no grpcio outside CI (a skip for meson test).
        [ "$status" = 77 ] || echo "$me: topology-bench.py failed with status $status" >&2
        exit "$status"
fi

if [ "$smoke" = 1 ]; then
        # The --quick tables, ratios and the goal, as finite numbers.
        num='[0-9]+\.[0-9]+'
        range="$num \\[$num-$num\\]"
        for pat in "^100 +2 +$range +$range +$range +[0-9]+ +$range\$" \
                   "^100 +4 +$range +$range +$range +[0-9]+ +$range\$" \
                   "^ +4 +3 +$num +$num +$num +$num +$num\$" \
                   "^ratio traffic per peer N=4/N=2: messages $num bytes $num\$" \
                   "^goal traffic per peer flat N=4/N=2 <= 1\\.50: $num (met|NOT MET)\$" \
                   "^ratio idle cpu 3 peers/none @1000ms: stat ($num|inf) sched $num " \
                   "^ratio idle cpu 3 peers/none @100ms: stat ($num|inf) sched $num " \
                   "^100 +4 +keyed +$range +$range *\$" \
                   "^100 +4 +plain +$range +$range *\$" \
                   "^ratio auth join N=4 @100ms keyed/plain: $num \([-+][0-9]+ ms\)\$" \
                   "^ratio auth idle cpu keyed/plain @1000ms: sched $num \(median of 1 windows\)\$" \
                   "^goal auth idle cpu @100ms keyed/plain <= 1\.10: $num (met|NOT MET)\$" \
                   "^goals (met|NOT MET)\$"; do
                if ! grep -Eq "$pat" "$out"; then
                        echo "$me: smoke: no line matching /$pat/" >&2
                        exit 1
                fi
        done
        echo "$me: smoke ok"
fi
