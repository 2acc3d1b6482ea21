# bench-daemon.sh: sourced by the bench runners. A temporary folder, familyd started in it and
# probed until it answers, and its stop, which must end it with status 0.
#
# The runner sets $me (its name, for messages), $familyd and $bench (the bench binary, which
# answers --socket PATH --probe with 0 once the daemon serves).

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
