#!/bin/bash
# run-bench.sh: start familyd on a temporary socket and run familyd-bench against it.
#
#   tests/bench/run-bench.sh [--smoke] [BUILD_DIR] [-- BENCH_ARGS...]
#
# BUILD_DIR (default: build-bench under the source root) is configured as a release build
# without sanitizers and built when it does not exist yet: numbers from an ASan build mean
# little. FAMILYD_BIN and FAMILYD_BENCH, when set (meson test sets them), name the binaries
# instead. The registry is $FAMILYD_BENCH_REGISTRY, else deploy/registry when it holds
# grouped_experts, else ../shared/conformance/registry.
#
# --smoke: a quick run (--quick) that checks the bench runs and prints its ratios, and that the
# daemon stops cleanly; the goals are printed, not enforced. Without --smoke the full run
# prints the table, ratios and goals; add `-- --check-goals` to fail when a goal is not met.

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${FAMILYD_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
shared=${FAMILYD_SHARED:-$root/../shared}

smoke=0
build=""
bench_args=()
while [ $# -gt 0 ]; do
        case "$1" in
        --smoke) smoke=1 ;;
        --) shift; bench_args+=("$@"); break ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "run-bench.sh: unknown option $1" >&2; exit 2 ;;
        *) build=$1 ;;
        esac
        shift
done

familyd=${FAMILYD_BIN:-}
bench=${FAMILYD_BENCH:-}
if [ -z "$familyd" ] || [ -z "$bench" ]; then
        build=${build:-$root/build-bench}
        if [ ! -f "$build/build.ninja" ]; then
                echo "run-bench.sh: configuring $build (release, no sanitizers)"
                meson setup "$build" "$root" -Dbuildtype=release -Db_sanitize=none >/dev/null
        fi
        ninja -C "$build" daemon/familyd tests/bench/familyd-bench >/dev/null
        familyd=${familyd:-$build/daemon/familyd}
        bench=${bench:-$build/tests/bench/familyd-bench}
fi
for f in "$familyd" "$bench"; do
        [ -x "$f" ] || { echo "run-bench.sh: $f not found" >&2; exit 1; }
done

registry=${FAMILYD_BENCH_REGISTRY:-}
if [ -z "$registry" ]; then
        if grep -qs '^\s*-\?\s*name:\s*grouped_experts\s*$' "$root"/deploy/registry/*.y*ml; then
                registry=$root/deploy/registry
        else
                registry=$shared/conformance/registry
        fi
fi

tmp=$(mktemp -d /tmp/fd-bench-XXXXXX)
pid=""
cleanup() {
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -rf "$tmp"
}
trap cleanup EXIT

sock=$tmp/familyd.sock
"$familyd" --socket "$sock" --shard-socket "$tmp/shard.sock" --state-dir "$tmp" \
        --registry "$registry" --host-devices 8 --node-name bench >"$tmp/familyd.log" 2>&1 &
pid=$!

ready=0
for _ in $(seq 1 300); do
        if ! kill -0 "$pid" 2>/dev/null; then
                echo "run-bench.sh: familyd exited before it was ready:" >&2
                cat "$tmp/familyd.log" >&2
                exit 1
        fi
        if [ -S "$sock" ] && "$bench" --socket "$sock" --probe 2>/dev/null; then
                ready=1
                break
        fi
        sleep 0.1
done
if [ "$ready" != 1 ]; then
        echo "run-bench.sh: familyd not SERVING within 30 s" >&2
        cat "$tmp/familyd.log" >&2
        exit 1
fi

echo "run-bench.sh: familyd $familyd, registry $registry"
if [ "$smoke" = 1 ]; then
        bench_args=(--quick "${bench_args[@]}")
fi

status=0
"$bench" --socket "$sock" "${bench_args[@]}" | tee "$tmp/bench.out" || status=$?

# Stop the daemon: SIGTERM must end it with status 0.
kill -TERM "$pid"
daemon_status=0
for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
        echo "run-bench.sh: familyd did not exit within 30 s of SIGTERM" >&2
        daemon_status=1
else
        wait "$pid" || daemon_status=$?
fi
pid=""
if [ "$daemon_status" != 0 ]; then
        echo "run-bench.sh: familyd exited with status $daemon_status after SIGTERM" >&2
        tail -n 30 "$tmp/familyd.log" >&2
        [ "$status" != 0 ] || status=1
fi
if [ "$status" != 0 ]; then
        echo "run-bench.sh: familyd-bench failed with status $status" >&2
        exit "$status"
fi

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
