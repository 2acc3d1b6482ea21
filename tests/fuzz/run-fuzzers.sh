#!/usr/bin/env bash
# run-fuzzers.sh: builds the libFuzzer targets with clang and runs each for a while; what CI runs.
#
#   tests/fuzz/run-fuzzers.sh [--seconds N] [--build DIR] [--keep DIR] [--results FILE] [NAME...]
#
# NAME: registry wire request expr config shard-socket peer safetensors (default: all). --seconds: per fuzzer
# (default 20, or $FUZZ_SECONDS). --build: the clang build folder (default build-fuzz under the
# source root, or $FAMILYD_FUZZ_BUILD; configured with -Dfuzzing=true and ASan+UBSan when it
# does not exist). --keep DIR: keep each fuzzer's new inputs under DIR/NAME (default: a
# temporary folder, removed at the end). --results FILE: one line per fuzzer in the format of
# meson's testlog.json ({"name": ..., "result": "OK" | "FAIL"}), for run-all.sh's count.
#
# Each fuzzer starts from its committed corpus (tests/fuzz/corpus/NAME, read-only: new inputs go
# to the scratch folder), runs -max_total_time seconds, and prints its execution count. A crash,
# a leak, a UBSan report or an input running over 10 s fails the run; the input is kept as
# BUILD/fuzz-artifacts/NAME-crash-<sha1> (replay: BUILD/tests/fuzz/fuzz-NAME-libfuzzer FILE).
# Then it replays everything it has (-runs=0 -print_coverage=1) and prints the daemon's functions
# it covered, by file, and fails when one of the functions that prove it reached the handler
# (REQUIRED below) is not among them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=${FUZZ_SECONDS:-20}
build=${FAMILYD_FUZZ_BUILD:-$root/build-fuzz}
keep=""
results=""
names=()
while [ $# -gt 0 ]; do
        case "$1" in
        --seconds) seconds=$2; shift ;;
        --build) build=$2; shift ;;
        --keep) keep=$2; shift ;;
        --results) results=$2; shift ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "run-fuzzers.sh: unknown option $1" >&2; exit 2 ;;
        *) names+=("$1") ;;
        esac
        shift
done
[ ${#names[@]} -gt 0 ] || names=(registry wire request expr config shard-socket peer safetensors)

# Functions (file:function) each fuzzer must reach: the handler behind the decoder.
declare -A REQUIRED=(
        [registry]="daemon/core/registry-load.c:registry_load daemon/core/registry-family.c:loader_family daemon/core/registry-parameter.c:loader_parameters daemon/core/expr.c:expr_parse daemon/core/resolve.c:resolve_family daemon/codec/codec-family.c:codec_family_encode"
        [wire]="daemon/codec/codec-wire.c:codec_wire_check"
        [request]="daemon/rpc/service-family.c:resolve daemon/rpc/service-mesh.c:create_mesh daemon/rpc/service-build.c:build daemon/build/build.c:build_draft daemon/rpc/service-validate.c:validate daemon/rpc/service-family.c:get_family daemon/core/resolve.c:resolve_family daemon/core/build-plan.c:build_plan daemon/core/layout.c:layout_compute daemon/core/validate.c:validate_model daemon/core/mesh.c:mesh_new daemon/rpc/service-build.c:release_build daemon/rpc/service-mesh.c:delete_mesh daemon/codec/codec-status.c:codec_status_encode"
        [expr]="daemon/core/expr.c:expr_parse daemon/core/expr.c:expr_to_string daemon/core/expr.c:expr_eval daemon/core/expr.c:expr_foreach_field"
        [config]="daemon/config.c:config_parse daemon/config.c:config_parse_file daemon/config.c:config_apply daemon/config.c:config_fill_derived"
        [peer]="daemon/codec/codec-peer.c:codec_peer_decode daemon/membership/peer-protocol.c:protocol_on_message daemon/membership/membership.c:membership_heard_from daemon/membership/membership.c:membership_learn daemon/membership/membership.c:membership_forget daemon/membership/membership.c:membership_tick daemon/membership/membership.c:membership_topology daemon/membership/membership.c:membership_verdict"
        [shard-socket]="daemon/handout/shard-socket.c:on_listener_io daemon/handout/shard-socket.c:connection_read daemon/handout/shard-socket.c:connection_handle_frame daemon/handout/shard-socket.c:connection_answer daemon/handout/shard-socket.c:connection_flush daemon/handout/shard-table.c:shard_table_lookup_many_as daemon/shm/segment.c:shard_segment_open"
        [safetensors]="common/safetensors.c:safetensors_header_size common/safetensors.c:safetensors_header_parse common/safetensors.c:tensor_parse common/safetensors.c:coverage_check common/safetensors.c:safetensors_index_parse common/safetensors.c:safetensors_index_check"
)

if ! command -v clang >/dev/null; then
        echo "run-fuzzers.sh: clang not found (bash deploy/dev/install-deps.sh --tests installs it)" >&2
        exit 1
fi
if [ ! -f "$build/build.ninja" ]; then
        echo "run-fuzzers.sh: configuring $build (clang, -Dfuzzing=true, ASan+UBSan)"
        CC=clang meson setup "$build" "$root" -Dfuzzing=true -Db_sanitize=address,undefined \
                -Db_lundef=false -Dwerror=true >/dev/null
elif [ "$(meson introspect --buildoptions "$build" | /usr/bin/python3 -c 'import json, sys
print([o["value"] for o in json.load(sys.stdin) if o["name"] == "fuzzing"] == [True])')" != True ]
then
        echo "run-fuzzers.sh: $build is not configured with -Dfuzzing=true; reconfiguring"
        meson configure "$build" -Dfuzzing=true -Db_sanitize=address,undefined \
                -Db_lundef=false >/dev/null
fi
targets=()
for n in "${names[@]}"; do
        [ -n "${REQUIRED[$n]+x}" ] || { echo "run-fuzzers.sh: no fuzzer named $n" >&2; exit 2; }
        targets+=("tests/fuzz/fuzz-$n-libfuzzer")
done
work=$(mktemp -d /tmp/fd-fuzz-XXXXXX)
trap 'rm -rf "$work"' EXIT
if ! ninja -C "$build" "${targets[@]}" >"$work/ninja.log" 2>&1; then
        echo "run-fuzzers.sh: building the fuzzers in $build failed:" >&2
        tail -n 30 "$work/ninja.log" >&2
        for n in "${names[@]}"; do
                [ -z "$results" ] || printf '{"name": "fuzz-%s-libfuzzer", "result": "FAIL"}\n' "$n" >>"$results"
        done
        exit 1
fi

# llvm-symbolizer names the covered functions (and symbolizes crash reports): the one of the
# clang that built the fuzzers (Debian 12 has clang 14, Debian 13 clang 19), from the LLVM tree
# its binary lives in (/usr/bin/clang -> /usr/lib/llvm-N/bin/clang), else from the tree above
# its resource directory (/usr/lib/llvm-N/lib/clang/V).
llvm_bin=$(dirname "$(readlink -f "$(command -v clang)")")
if [ ! -x "$llvm_bin/llvm-symbolizer" ]; then
        llvm_bin=$(clang -print-resource-dir)/../../../bin
fi
if [ -x "$llvm_bin/llvm-symbolizer" ]; then
        PATH="$(cd "$llvm_bin" && pwd):$PATH"
        export PATH
else
        echo "run-fuzzers.sh: no llvm-symbolizer beside $(command -v clang); reports name no functions" >&2
fi
export FAMILYD_CONFORMANCE=${FAMILYD_CONFORMANCE:-$root/tests/conformance}
# Reports halt (a UBSan finding is a crash); leaks are checked after each input and at exit.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"

status=0
result() { # NAME OK|FAIL
        [ -z "$results" ] || printf '{"name": "fuzz-%s-libfuzzer", "result": "%s"}\n' "$1" "$2" >>"$results"
}
for n in "${names[@]}"; do
        bin="$build/tests/fuzz/fuzz-$n-libfuzzer"
        new=${keep:+$keep/$n}
        new=${new:-$work/$n}
        mkdir -p "$new"
        log="$work/$n.log"
        rc=0
        "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
                -artifact_prefix="$artifacts/$n-" "$new" "$here/corpus/$n" >"$log" 2>&1 || rc=$?
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
        added=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -n1)
        if [ "$rc" != 0 ]; then
                echo "fuzz-$n: FAILED after ${execs:-?} executions (exit $rc):"
                grep -E "^(==[0-9]+==ERROR|SUMMARY|artifact_prefix|Test unit written|.*runtime error)" \
                        "$log" | head -n 20 | sed 's/^/  /'
                tail -n 40 "$log" | sed 's/^/  | /'
                status=1
                result "$n" FAIL
                continue
        fi

        # What it reached: every function of daemon/ and common/ of the corpus and the new inputs.
        "$bin" -runs=0 -print_coverage=1 "$new" "$here/corpus/$n" >"$work/$n.cov" 2>&1 || {
                echo "fuzz-$n: the coverage replay failed:"; tail -n 20 "$work/$n.cov" | sed 's/^/  | /'
                status=1; result "$n" FAIL; continue; }
        awk '$1 == "COVERED_FUNC:" { f = $7
                if (!sub(/.*\/daemon\//, "daemon/", f) && !sub(/.*\/common\//, "common/", f)) next
                sub(/:[0-9]+$/, "", f); print f ":" $6 }' \
                "$work/$n.cov" | sort -u >"$work/$n.funcs"
        nfuncs=$(wc -l <"$work/$n.funcs")
        printf 'fuzz-%s: %s s, %s executions, 0 crashes, %s new inputs, %s functions covered\n' \
                "$n" "$seconds" "$execs" "${added:-0}" "$nfuncs"
        awk -F: '{ if ($1 != file) { if (file) print line; file = $1; line = "  " $1 ":" }
                   line = line " " $2 } END { if (file) print line }' "$work/$n.funcs"
        ok=OK
        for req in ${REQUIRED[$n]}; do
                if ! grep -qxF "$req" "$work/$n.funcs"; then
                        echo "fuzz-$n: did not reach ${req%%:*} ${req#*:}()"
                        ok=FAIL
                        status=1
                fi
        done
        result "$n" "$ok"
done
exit $status
