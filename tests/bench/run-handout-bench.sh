#!/bin/bash
# run-handout-bench.sh: start familyd with a one-parameter registry and run handout-bench.
#
#   tests/bench/run-handout-bench.sh [--smoke] [--huge-pages[=N]] [BUILD_DIR] [-- BENCH_ARGS...]
#
# BUILD_DIR (default: build-bench under the source root) is configured as a release build
# without sanitizers and built when it does not exist yet. FAMILYD_BIN and
# FAMILYD_HANDOUT_BENCH, when set (meson test sets them), name the binaries instead.
#
# The registry, written to a temporary directory, has one family `blob` with one parameter
# `data` of shape [n], init constant 1.0, so every read can be checked (the sum is n). The
# daemon gets --shm-budget 3 GiB (one build is held at a time). The full run measures 1, 64 and
# 1024 MiB; with MemAvailable under HANDOUT_BENCH_MIN_KIB (default 4.5 GiB: the shard, the
# baseline server's payload, the gRPC client's copy and the host mapping's own memfd are each
# 1 GiB) it drops 1024 MiB and
# says so. --smoke: --quick (1 and 16 MiB) and a check that the table and goals are printed; the
# goals are not enforced. Add `-- --check-goals` to fail when a goal is missed.
#
# --huge-pages (root): reserves N 2 MiB huge pages (vm.nr_hugepages) for the run and puts the
# old value back at exit, so the daemon (--huge-pages auto) makes the shards on huge pages. N
# defaults to the pages the sizes' shards take (545 for 1, 64 and 1024 MiB): with
# `-- --fill-compare 1024`, the first of its two Builds then finds huge pages and the second
# none, which compares a fresh fill on both kinds in one run. Without --huge-pages the run
# takes the host as it is (on a host without reserved pages: 4 KiB pages).

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${FAMILYD_SOURCE_ROOT:-$(cd "$here/../.." && pwd)}

me=run-handout-bench.sh
. "$here/bench-daemon.sh"

# --huge-pages[=N] is this runner's own; the rest is the runners' common command line.
huge_pages=""
args=()
for a in "$@"; do
        case "$a" in
        --) args+=("$a"); shift; args+=("$@"); break ;;
        --huge-pages) huge_pages=auto ;;
        --huge-pages=*) huge_pages=${a#--huge-pages=} ;;
        *) args+=("$a") ;;
        esac
        shift
done
bench_parse_args 23 "${args[@]}"

familyd=${FAMILYD_BIN:-}
bench=${FAMILYD_HANDOUT_BENCH:-}
bench_build tests/bench/handout-bench

sizes_args=()
if [ "$smoke" = 1 ]; then
        sizes_args=(--quick)
else
        min_kib=${HANDOUT_BENCH_MIN_KIB:-4718592}
        avail_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
        if [ -n "$avail_kib" ] && [ "$avail_kib" -lt "$min_kib" ]; then
                echo "run-handout-bench.sh: NOTE: MemAvailable $((avail_kib / 1024)) MiB < $((min_kib / 1024)) MiB:" \
                     "skipping the 1024 MiB size; the goals are judged at 64 MiB"
                sizes_args=(--sizes 1,64)
        fi
fi

bench_tmp handout

nr_hugepages=/proc/sys/vm/nr_hugepages
hugepages_saved=""
handout_cleanup() {
        bench_cleanup
        if [ -n "$hugepages_saved" ]; then
                echo "$hugepages_saved" >"$nr_hugepages" || true
        fi
}
if [ -n "$huge_pages" ]; then
        if [ "$huge_pages" = auto ]; then
                # The shards of the sizes run, each rounded up to whole 2 MiB pages.
                if [ "$smoke" = 1 ]; then huge_pages=9
                elif [ "${sizes_args[*]}" = "--sizes 1,64" ]; then huge_pages=33
                else huge_pages=545
                fi
        fi
        hugepages_saved=$(cat "$nr_hugepages")
        trap handout_cleanup EXIT
        echo "$huge_pages" >"$nr_hugepages"
        got=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
        echo "run-handout-bench.sh: vm.nr_hugepages $huge_pages for this run ($got free; was $hugepages_saved)"
fi

mkdir "$tmp/registry"
cat >"$tmp/registry/blob.yaml" <<'EOF'
# handout-bench: one float32 parameter of n elements, all 1.0.
families:
  - name: blob
    baseline: familyd_bench.Blob
    default_variant: plain
    variants:
      plain:
        constructor: familyd_bench.BlobLocal
        accepts: [config]
    parameters:
      data:
        shape: [n]
        init: {constant: {value: 1.0}}
EOF

bench_daemon_start "$tmp/registry" --host-devices 1 --node-name bench --shm-budget $((3 << 30))

echo "run-handout-bench.sh: familyd $familyd"
status=0
"$bench" --socket "$sock" "${sizes_args[@]}" "${bench_args[@]}" | tee "$tmp/bench.out" || status=$?

# Stop the daemon: SIGTERM must end it with status 0.
bench_daemon_stop "$status"

if [ "$smoke" = 1 ]; then
        # The table's ratios and the goals must be printed, as finite numbers.
        num='[0-9]+\.[0-9]+'
        for pat in "^ratio grpc/\\(map\\+read\\) @1MiB $num recv/\\(map\\+read\\) $num read GB/s map $num grpc $num\$" \
                   "^ratio grpc/\\(map\\+read\\) @16MiB $num recv/\\(map\\+read\\) $num read GB/s map $num grpc $num\$" \
                   "^goal map flat map@16MiB/map@1MiB <= $num: $num (met|NOT MET)\$" \
                   "^goal grpc/\\(map\\+read\\) @16MiB >= $num: $num (met|NOT MET)\$" \
                   "^goals (met|NOT MET)\$"; do
                if ! grep -Eq "$pat" "$tmp/bench.out"; then
                        echo "run-handout-bench.sh: smoke: no line matching /$pat/" >&2
                        exit 1
                fi
        done
        # The host's own mapping of the same bytes, measured wherever the shard is not hugetlb.
        if ! grep -q '^16 MiB (huge pages)' "$tmp/bench.out" &&
           ! grep -Eq "^host mapping @16MiB \\(a plain memfd, mapped, populated and read the same way\\): $num over the read floor; familyd populated / host mapping $num\$" "$tmp/bench.out"; then
                echo "run-handout-bench.sh: smoke: no host mapping line for 16 MiB" >&2
                exit 1
        fi
        echo "run-handout-bench.sh: smoke ok"
fi
