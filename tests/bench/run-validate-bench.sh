#!/bin/bash
# run-validate-bench.sh: start familyd on a temporary socket and run validate-bench against it.
#
#   tests/bench/run-validate-bench.sh [--smoke] [BUILD_DIR] [-- BENCH_ARGS...]
#
# BUILD_DIR (default: build-bench under the source root) is configured as a release build
# without sanitizers and built when it does not exist yet: numbers from an ASan build mean
# little. FAMILYD_BIN and FAMILYD_VALIDATE_BENCH, when set (meson test sets them), name the
# binaries instead. The daemon gets the conformance registry ($FAMILYD_BENCH_REGISTRY, else
# tests/conformance/registry) and --host-devices 8; the bench makes its own mesh and Build.
#
# The full run times Validate of 1,000, 2,000, 5,000 and 10,000 boundaries and prints the time
# per boundary and the ratio largest/smallest (goal <= 1.5); add `-- --check-goals` to fail
# when the goal is missed. --smoke: --quick (1,000 and 2,000 boundaries), a check that the table
# and the ratio are printed and that the daemon stops cleanly; the goal is not enforced.

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${FAMILYD_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
conformance=${FAMILYD_CONFORMANCE:-$root/tests/conformance}

me=run-validate-bench.sh
. "$here/bench-daemon.sh"
bench_parse_args 15 "$@"

familyd=${FAMILYD_BIN:-}
bench=${FAMILYD_VALIDATE_BENCH:-}
bench_build tests/bench/validate-bench

registry=${FAMILYD_BENCH_REGISTRY:-$conformance/registry}
[ -d "$registry" ] || { echo "run-validate-bench.sh: registry $registry not found" >&2; exit 1; }

bench_tmp vbench

bench_daemon_start "$registry" --host-devices 8 --node-name vbench

echo "run-validate-bench.sh: familyd $familyd, registry $registry"
if [ "$smoke" = 1 ]; then
        bench_args=(--quick "${bench_args[@]}")
fi

status=0
"$bench" --socket "$sock" "${bench_args[@]}" | tee "$tmp/bench.out" || status=$?

# Stop the daemon: SIGTERM must end it with status 0.
bench_daemon_stop "$status"

if [ "$smoke" = 1 ]; then
        # A row per size and the ratio, as finite numbers.
        num='[0-9]+\.[0-9]+'
        for pat in "^1000 +[0-9]+ +[0-9]+ +[0-9]+ +$num +$num +$num\$" \
                   "^2000 +[0-9]+ +[0-9]+ +[0-9]+ +$num +$num +$num\$" \
                   "^ratio: time per boundary at 2000 / at 1000 = $num +goal <= $num: (met|MISSED)\$"; do
                if ! grep -Eq "$pat" "$tmp/bench.out"; then
                        echo "run-validate-bench.sh: smoke: no line matching /$pat/" >&2
                        exit 1
                fi
        done
        echo "run-validate-bench.sh: smoke ok"
fi
