#!/bin/bash
# run-bench.sh: start familyd on a temporary socket and run familyd-bench against it.
#
#   tests/bench/run-bench.sh [--smoke] [BUILD_DIR] [-- BENCH_ARGS...]
#
# BUILD_DIR (default: build-bench under the source root) is configured as a release build
# without sanitizers and built when it does not exist yet: numbers from an ASan build mean
# little. FAMILYD_BIN and FAMILYD_BENCH, when set (meson test sets them), name the binaries
# instead. The registry is $FAMILYD_BENCH_REGISTRY, else deploy/registry when it holds
# grouped_experts, else tests/conformance/registry.
#
# --smoke: a quick run (--quick) that checks the bench runs and prints its ratios, and that the
# daemon stops cleanly; the goals are printed, not enforced. Without --smoke the full run
# prints the table, ratios and goals; add `-- --check-goals` to fail when a goal is not met.

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${FAMILYD_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
conformance=${FAMILYD_CONFORMANCE:-$root/tests/conformance}

me=run-bench.sh
. "$here/bench-daemon.sh"
bench_parse_args 14 "$@"

familyd=${FAMILYD_BIN:-}
bench=${FAMILYD_BENCH:-}
bench_build tests/bench/familyd-bench

registry=${FAMILYD_BENCH_REGISTRY:-}
if [ -z "$registry" ]; then
        if grep -qs '^\s*-\?\s*name:\s*grouped_experts\s*$' "$root"/deploy/registry/*.y*ml; then
                registry=$root/deploy/registry
        else
                registry=$conformance/registry
        fi
fi

bench_tmp bench

bench_daemon_start "$registry" --host-devices 8 --node-name bench

echo "run-bench.sh: familyd $familyd, registry $registry"
if [ "$smoke" = 1 ]; then
        bench_args=(--quick "${bench_args[@]}")
fi

status=0
"$bench" --socket "$sock" "${bench_args[@]}" | tee "$tmp/bench.out" || status=$?

# Stop the daemon: SIGTERM must end it with status 0.
bench_daemon_stop "$status"

if [ "$smoke" = 1 ]; then
        # The ratios must be printed, as finite numbers.
        num='[0-9]+\.[0-9]+'
        for pat in "^ratio resolve/empty +p50 $num p99 $num( throughput@[0-9]+ $num)+\$" \
                   "^ratio resolve/raw +p50 $num p99 $num( throughput@[0-9]+ $num)+\$" \
                   "^goal p50 resolve/empty <= $num: $num (met|NOT MET)\$" \
                   "^goal throughput@16 resolve/empty >= $num: $num (met|NOT MET)\$"; do
                if ! grep -Eq "$pat" "$tmp/bench.out"; then
                        echo "run-bench.sh: smoke: no line matching /$pat/" >&2
                        exit 1
                fi
        done
        echo "run-bench.sh: smoke ok"
fi
