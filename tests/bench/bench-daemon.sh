# bench-daemon.sh: sourced by the bench runners. Their command line and build, a temporary
# folder, familyd started in it and probed until it answers, and its stop, which must end it
# with status 0.
#
# The runner sets $me (its name, for messages), $familyd and $bench (the bench binary, which
# answers --socket PATH --probe with 0 once the daemon serves).

# bench_parse_args HELP_LINES "$@": the runners' common command line, [--smoke] [BUILD_DIR]
# [-- BENCH_ARGS...]; sets $smoke, $build and $bench_args. --help prints lines 2..HELP_LINES of
# the runner (its header comment).
bench_parse_args() {
        local help_lines=$1
        shift
        smoke=0
        build=""
        bench_args=()
        while [ $# -gt 0 ]; do
                case "$1" in
                --smoke) smoke=1 ;;
                --) shift; bench_args+=("$@"); break ;;
                -h|--help) sed -n "2,${help_lines}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
                -*) echo "$me: unknown option $1" >&2; exit 2 ;;
                *) build=$1 ;;
                esac
                shift
        done
}

# bench_build TARGET...: unless $familyd and $bench are both set already (meson test sets them),
# configures $build (default build-bench under the source root) as a release build without
# sanitizers when it does not exist (numbers from an ASan build mean little), builds the
# daemon and TARGETs, and sets the unset ones of $familyd and $bench (from the first TARGET).
bench_build() {
        if [ -z "$familyd" ] || [ -z "$bench" ]; then
                build=${build:-$root/build-bench}
                if [ ! -f "$build/build.ninja" ]; then
                        echo "$me: configuring $build (release, no sanitizers)"
                        meson setup "$build" "$root" -Dbuildtype=release -Db_sanitize=none >/dev/null
                fi
                ninja -C "$build" daemon/familyd "$@" >/dev/null
                familyd=${familyd:-$build/daemon/familyd}
                bench=${bench:-$build/$1}
        fi
        for f in "$familyd" "$bench"; do
                [ -e "$f" ] || { echo "$me: $f not found" >&2; exit 1; }
        done
}

# Makes $tmp (removed at exit, with any daemon still running killed).
bench_tmp() {
        tmp=$(mktemp -d "/tmp/fd-$1-XXXXXX")
        pid=""
        trap bench_cleanup EXIT
}

bench_cleanup() {
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -rf "$tmp"
}

# bench_daemon_start REGISTRY [FAMILYD ARGS...]: starts familyd on $tmp/familyd.sock ($sock)
# and waits up to 30 s for the bench's probe; exits the runner when it does not come up.
bench_daemon_start() {
        local registry=$1
        shift
        sock=$tmp/familyd.sock
        "$familyd" --socket "$sock" --shard-socket "$tmp/shard.sock" \
                --registry "$registry" "$@" >"$tmp/familyd.log" 2>&1 &
        pid=$!

        for _ in $(seq 1 300); do
                if ! kill -0 "$pid" 2>/dev/null; then
                        echo "$me: familyd exited before it was ready:" >&2
                        cat "$tmp/familyd.log" >&2
                        exit 1
                fi
                if [ -S "$sock" ] && "$bench" --socket "$sock" --probe 2>/dev/null; then
                        return 0
                fi
                sleep 0.1
        done
        echo "$me: familyd not answering within 30 s" >&2
        cat "$tmp/familyd.log" >&2
        exit 1
}

# bench_daemon_stop STATUS: SIGTERM, then the daemon must exit 0 within 30 s; exits the runner
# with STATUS (or 1 when the daemon misbehaved and STATUS is 0) unless all is well.
bench_daemon_stop() {
        local status=$1 daemon_status=0
        kill -TERM "$pid"
        for _ in $(seq 1 300); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
                echo "$me: familyd did not exit within 30 s of SIGTERM" >&2
                daemon_status=1
        else
                wait "$pid" || daemon_status=$?
        fi
        pid=""
        if [ "$daemon_status" != 0 ]; then
                echo "$me: familyd exited with status $daemon_status after SIGTERM" >&2
                tail -n 30 "$tmp/familyd.log" >&2
                [ "$status" != 0 ] || status=1
        fi
        if [ "$status" != 0 ]; then
                echo "$me: $(basename "$bench") failed with status $status" >&2
                exit "$status"
        fi
}
