#!/bin/bash
# run-load.sh: start familyd on a temporary socket and run familyd-load against it.
#
#   tests/load/run-load.sh [--ci] [--duration S] [BUILD_DIR] [-- LOAD_ARGS...]
#
# Default: 64 clients (8 processes of 8 threads; as root each process its own uid) for 600 s,
# the first 60 s warm-up. --ci: 30 s, 10 s warm-up (the integration test `load`). BUILD_DIR
# (default: build-load under the source root) is configured as a release build without
# sanitizers and built when it does not exist yet; FAMILYD_BIN and FAMILYD_LOAD, when set (meson
# test sets them), name the binaries instead. The daemon gets the conformance registry and
# --host-devices 8; it must stop with status 0 on SIGTERM afterwards. LOAD_ARGS go to
# familyd-load (--clients, --procs, --rss-growth-pct, --fd-growth, --fd-swing, --samples FILE, ...).
#
# Under ASan (the CI build) the daemon's quarantine of freed memory is cut to 16 MiB so that
# it fills during the warm-up instead of looking like growth, and the memory limit is 32 MiB
# instead of 16 (see below).

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${FAMILYD_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}
conformance=${FAMILYD_CONFORMANCE:-$root/tests/conformance}

duration=600
warmup=60
build=""
load_args=()
while [ $# -gt 0 ]; do
        case "$1" in
        --ci) duration=30; warmup=10 ;;
        --duration) duration=$2; warmup=$(( $2 / 10 > 60 ? 60 : $2 / 10 )); shift ;;
        --) shift; load_args+=("$@"); break ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "run-load.sh: unknown option $1" >&2; exit 2 ;;
        *) build=$1 ;;
        esac
        shift
done

familyd=${FAMILYD_BIN:-}
bench=${FAMILYD_LOAD:-}
if [ -z "$familyd" ] || [ -z "$bench" ]; then
        build=${build:-$root/build-load}
        if [ ! -f "$build/build.ninja" ]; then
                echo "run-load.sh: configuring $build (release, no sanitizers)"
                meson setup "$build" "$root" -Dbuildtype=release -Db_sanitize=none >/dev/null
        fi
        ninja -C "$build" daemon/familyd tests/load/familyd-load >/dev/null
        familyd=${familyd:-$build/daemon/familyd}
        bench=${bench:-$build/tests/load/familyd-load}
fi
for f in "$familyd" "$bench"; do
        [ -x "$f" ] || { echo "run-load.sh: $f not found" >&2; exit 1; }
done
registry=$conformance/registry
[ -d "$registry" ] || { echo "run-load.sh: registry $registry not found" >&2; exit 1; }

export ASAN_OPTIONS="quarantine_size_mb=16${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
# Under ASan memory also grows with every thread ever created (its thread registry keeps them),
# and a materialising Build starts fill helper threads (about 0.3 MiB/s at this load, none in
# a release build): the memory limit is 32 MiB there, 16 MiB otherwise. LOAD_ARGS come later
# and win.
sanitized=()
if grep -q __asan_init "$familyd"; then
        sanitized=(--rss-growth-mib 32)
fi

me=run-load.sh
. "$root/tests/bench/bench-daemon.sh"
bench_tmp load
# Clients of other uids (group 0 kept) reach the 0660 sockets through this folder.
chmod 0755 "$tmp"

bench_daemon_start "$registry" --host-devices 8 --node-name load --build-grace-ms 0

echo "run-load.sh: familyd $familyd, registry $registry"
status=0
"$bench" --socket "$sock" --pid "$pid" --duration "$duration" --warmup "$warmup" \
        "${sanitized[@]}" "${load_args[@]}" || status=$?

# Stop the daemon: SIGTERM must end it with status 0 (under ASan: no leak at exit).
bench_daemon_stop "$status"
echo "run-load.sh: the daemon stopped cleanly"
